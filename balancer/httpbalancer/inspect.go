package httpbalancer

import (
	"encoding/binary"
	"net/http"
	"strings"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/cache"
	"github.com/inferlb/inferlb/internal/tokenest"
)

// Info is what inspection learns about one request. The Transport routes on
// Request and uses Stream as a hint for reading the response.
type Info struct {
	inferlb.Request
	// Stream is set when the body asks for a streamed (SSE) response
	// ("stream": true, or a value vLLM's and SGLang's pydantic validation
	// reads as true: "true", "yes", "1", 1, ...). The transport treats a response as a stream when
	// its Content-Type is text/event-stream (or Ollama's
	// application/x-ndjson), or when Stream is set and the Content-Type is
	// not JSON. Ollama's native paths stream unless the body says "stream":
	// false; Stream reads false there when the field is absent, and the
	// content type finds the stream.
	Stream bool

	// salt is a digest of the body's vLLM cache_salt (saltTag), set by
	// the OpenAI inspector for an LLM call, so that the Transport scopes
	// a session header's key by it as Inspect scopes the body's keys
	// (sessionKey); zero when the body has none. Three bytes, it fits in
	// Stream's padding, before pin: Info keeps its size (it is copied per
	// call, and the call state keeps its size class).
	salt [3]byte

	// pin is the serial (balancer.Pick.Serial, truncated) of the endpoint
	// that made the response a Responses API follow-up continues, when the
	// Transport remembers it; 0 otherwise. It fits in Stream's padding, so
	// Info keeps its size.
	pin uint32
}

// An Inspector classifies a request for routing. Inspect fills info from the
// request's method, URL and headers and from body, the first bytes of the
// request body (all of it when complete is true; nil when the transport did
// not read ahead, see Options.MaxPeek).
//
// Inspect must not modify r or retain body, must be safe for concurrent use,
// and must not panic on any input: request bodies are untrusted. Session and
// tenant headers are applied by the Transport after Inspect returns. A
// session header's key is scoped by the body's vLLM cache_salt when the
// default Inspector (an *OpenAI) read one, as the body's own keys are: two
// tenants that send one session ID with their own salts get two keys (see
// OpenAI). Another Inspector's calls key session headers unsalted.
type Inspector interface {
	Inspect(r *http.Request, body []byte, complete bool, info *Info)
}

// InspectorFunc adapts a function to the Inspector interface.
type InspectorFunc func(r *http.Request, body []byte, complete bool, info *Info)

// Inspect calls f.
func (f InspectorFunc) Inspect(r *http.Request, body []byte, complete bool, info *Info) {
	f(r, body, complete, info)
}

var (
	_ Inspector = (*OpenAI)(nil)
	_ Inspector = InspectorFunc(nil)
)

// OpenAI inspects OpenAI-compatible APIs as served by vLLM, SGLang, TGI,
// TensorRT-LLM and Triton's OpenAI frontend, plus the native paths of TGI,
// SGLang (/generate: text or input_ids, sampling_params) and Hugging Face
// TEI, and Triton's (KServe v2) model paths. It is the default Inspector.
//
// The service comes from the last path segments, so a gateway prefix
// ("/openai/v1/chat/completions") is fine:
//
//	.../chat/completions, .../completions, .../responses,
//	.../messages (Anthropic's Messages API, which vLLM,
//	SGLang and llama.cpp serve too),
//	.../generate, .../generate_stream, .../api/chat,
//	llama.cpp's .../completion and .../infill              -> LLM
//	.../embeddings, .../embed, .../classify, .../pooling,
//	TEI's .../embed_all and .../embed_sparse,
//	llama.cpp's .../embedding                             -> embedding
//	.../rerank, .../score, llama.cpp's .../reranking      -> rerank
//
// On a Triton (KServe v2) path, /v2/models/{name}[/versions/{v}]/..., the
// model is the name in the path, which is what Triton routes by (the
// version is not part of it: list the name in the endpoint's "model" label,
// balancer.Options.SubsetLabel); there the generate extension's text_input
// is the prompt, as TensorRT-LLM takes it.
//
// From a JSON body (one that opens with a UTF-8 byte order mark too, as
// Python servers read it; the mark is forwarded with the rest) it reads
// model, stream, the output bound (max_tokens, max_completion_tokens,
// max_output_tokens, TGI's and SGLang's max_new_tokens; times n or
// SGLang's sampling_params.n, the choices asked for, up to 128; times the
// prompts of a batch: a completions prompt, or SGLang's text or input_ids,
// given as a list of strings or of token-ID lists, is a completion per
// prompt, and SGLang's sampling_params may then be a list, one object per
// prompt, whose largest max_new_tokens and n count; a flat list of token
// IDs is one prompt, and the lists of /v1/responses input items, of
// embeddings, of rerank documents and of the two sides of vLLM's score API
// (text_1 and text_2, queries and documents, data_1 and data_2, whose
// text counts as a rerank's query and documents do) multiply nothing), a prompt
// token estimate (bytes of prompt text / 4, counted as UTF-8 however the
// JSON spells it: a \uXXXX escape as its character, \n as one byte; tool definitions, calls and
// results included, as the server renders them into the prompt, and one
// token per ID of a prompt given as token IDs; or the body size / 4 when
// the body was larger than the peek, less its base64: what lies past the
// peek counts in the proportion of text, of escapes and of token IDs the peek shows;
// both estimates are capped at MaxTokenEstimate), and for LLM calls the
// affinity key, scoped by vLLM's cache_salt when the body has one
// (Keyer.Salted; a Transport's session header, which beats these keys, is
// scoped by the salt too, through a 24-bit digest of it that Info carries,
// so two salts give one session ID the same key once in 16 million pairs,
// and the key is not the one a prompt_cache_key of that ID and salt gets):
// the request's
// prompt_cache_key as a session, else the Responses API's conversation ID
// as a session, else, for a /v1/responses follow-up
// (previous_response_id) through a Transport that saw the response it
// continues, the key that response was routed with (see ResponseMemory),
// else the cache Keyer's key of the
// chat messages through the first user turn (Keyer.Chat; for /v1/responses
// the instructions count as a system message and a string input as the
// user's message, so a conversation's later turns, which resend it as
// input items, keep its key; for /v1/messages the top-level system is the
// system message) or of the prompt (Keyer.Prompt; a prompt of token IDs,
// or a batch of them, on its first list's leading IDs, about Depth/4 of
// them as a text key covers Depth characters, apart from text prompts). A
// message's text includes its text parts, a marker of each image,
// recording or video (a hash of its URL, data URL or base64; Ollama's
// images lists too, and a prompt's key covers the images beside it on
// /api/generate) and, for the Responses API's function call items, their
// output or arguments. The prompt token estimate leaves data URLs,
// the base64 strings of "data" members (input_audio) and those of
// Ollama's "images" lists out (an image's tokens are not its base64 bytes). A body larger than the peek is keyed on the
// messages that fit in it, which are the ones the key covers unless the
// first turns alone exceed the peek; then the message the peek ends in
// counts with what the peek holds of it (a document's first Depth
// characters, as whole; a photo's data URL up to the cut, the same in every
// turn of its conversation), and so does a prompt or string input the peek
// ends in. When such a body is held in memory (r.Body is an
// io.NopCloser over a bytes.Reader, strings.Reader or bytes.Buffer, as
// http.NewRequest and the Transport's copy from GetBody make it), its
// top-level model, stream, output bound, prompt_cache_key, conversation,
// previous_response_id and cache_salt are read from the whole body without reading it
// (about 4 GB/s; nothing is copied but 4 KiB at a time): the OpenAI SDKs
// write them after the messages. So is a system prompt given apart (system,
// instructions) no larger than the peek, which the Anthropic SDKs and
// openai-python write after the messages or input: a conversation keeps its
// key when its later turns outgrow the peek. The prompts of a batch are counted there
// too, however far past the peek its list runs (a batch is what most often
// outgrows the peek); a streamed body's batch counts the prompts the peek
// holds, a lower bound.
//
// For an embedding, rerank or score call it also estimates the longest
// single input (Info.LongestInput, by the same bytes / 4): the input
// itself when there is one, a rerank's or score call's longest query
// with its longest document, the longest text or token-ID list of an
// embeddings batch, of those the peek holds. That, not the batch's total,
// is what a pooling server bounds by its context window. For a generation
// call of several sequences (n > 1, or a batch of prompts) it sets
// Info.LongestInput to the longest prompt (the prompt estimate with n > 1
// alone; of a batch, the longest prompt the peek holds) and
// Info.SequenceOutputTokens to the output bound of one sequence, which a
// server bounds by its window each on its own.
//
// An OpenAI is immutable once in use and safe for concurrent use.
type OpenAI struct {
	// Keyer computes prompt affinity keys. nil means no prompt affinity
	// (session headers still apply).
	Keyer *cache.Keyer

	chains *responseChains // the Transport's, when it made this inspector
}

// ServiceForPath maps an OpenAI-compatible (or TGI/TEI, Ollama or
// llama.cpp) request path to a Service, as the OpenAI inspector does;
// unknown paths are ServiceUnknown. vLLM's /classify and /pooling run a pooling model once
// over the input, as an embedding does, and are routed as embeddings, as
// are TEI's /embed_all and /embed_sparse. TEI's /predict (classification)
// is left unknown: the name is too common to say what runs behind it.
// Audio transcription is left unknown: its multipart body's size says
// nothing of its tokens.
func ServiceForPath(path string) inferlb.Service {
	path = strings.TrimSuffix(path, "/")
	last := path[strings.LastIndexByte(path, '/')+1:]
	switch last {
	case "completions", "responses", "messages", "generate", "generate_stream", "chat", "completion", "infill":
		return inferlb.ServiceLLM
	case "embeddings", "embed", "classify", "pooling", "embedding", "embed_sparse", "embed_all":
		return inferlb.ServiceEmbedding
	case "rerank", "score", "reranking":
		return inferlb.ServiceRerank
	}
	return inferlb.ServiceUnknown
}

// modelInPath returns the model a Triton (KServe v2) path names,
// /v2/models/{name}/... after any gateway prefix, or "".
func modelInPath(path string) string {
	const v2 = "/v2/models/"
	i := strings.Index(path, v2)
	if i < 0 {
		return ""
	}
	name := path[i+len(v2):]
	if j := strings.IndexByte(name, '/'); j >= 0 {
		name = name[:j]
	}
	return name
}

// maxChoices bounds the n (choices) an output bound is multiplied by.
const maxChoices = 128

// MaxTokenEstimate bounds the prompt and output token estimates of one
// request (4,194,304 tokens, about 16 MB of text): above the largest
// context window served today (vLLM serves Llama 4 Scout with up to 3.6M
// tokens on 8 H200s; 1M is common: Qwen2.5-1M, MiniMax-M1, Scout on 8
// H100s), so no real request is cut, while a made-up size (a streamed body
// that declares gigabytes, a max_tokens near 2^31, a large n times a large
// bound) counts on its endpoint's in-flight tokens as one request of the
// largest possible size, not as hundreds of them.
const MaxTokenEstimate = tokenest.Max

// charsPerToken is the usual rule of thumb for English text under BPE
// tokenizers. It only has to rank requests by size, not bill them. It is
// applied to the bytes of the text's UTF-8, however the JSON spells it (a
// \uXXXX escape counts as its character's bytes, \n as one): for English
// that is the character count, and for scripts of 3-byte characters, at
// about one token a character, bytes/4 is closer to the truth than
// characters/4 (and than the six bytes of the escape Python clients send).
const charsPerToken = tokenest.BytesPerToken

// idScaled is size, an estimate of a body's prompt text in bytes taken
// past a peek of peek bytes, less what the peek shows of token IDs: a
// token ID is one token (charsPerToken bytes' worth) however many digits
// and separators it is written with, about seven bytes for a vocabulary of
// 100,000 or more. And less what the peek shows of escapes: text whose
// characters are written \uXXXX is counted by its UTF-8 (see escSaved),
// half its size for CJK. The rest of the body is taken to hold IDs and
// escapes in the peek's proportion.
// It is at most 2^31-1, which an int holds on 32-bit platforms too (an 8
// GB body's size, converted whole, read as 0 there).
func idScaled(size int64, b *body, peek int) int {
	if b.idBytes == 0 && b.saved == 0 || peek == 0 {
		return int(min(size, 1<<31-1))
	}
	ids := min(b.idBytes, peek) // a malformed list may count twice
	text := float64(peek - ids)
	if b.saved > 0 {
		// The share of the text's bytes as sent that its value holds.
		value := max(b.chars-charsPerToken*b.idCount+b.cut, 0)
		text *= float64(value) / float64(value+b.saved)
	}
	return int(min(float64(size)*(text+float64(charsPerToken*b.idCount))/float64(peek), 1<<31-1))
}

// Inspect implements Inspector.
func (o *OpenAI) Inspect(r *http.Request, peek []byte, complete bool, info *Info) {
	info.Service = ServiceForPath(r.URL.Path)
	pathModel := modelInPath(r.URL.Path)
	info.Model = pathModel
	if len(peek) == 0 {
		return
	}
	var b body
	keyed := info.Service == inferlb.ServiceLLM && o.Keyer != nil
	if keyed {
		b.depth = o.Keyer.Depth()
	}
	parseBody(peek, keyed, &b)
	if !complete {
		// The fields after the peek, from a body held in memory (jsontail.go).
		if m := inMemory(r.Body); m.ok() && m.n > int64(len(peek)) {
			readTail(&m, peek, keyed, &b)
		}
	}
	if pathModel == "" {
		info.Model = b.model
	} else {
		b.model = pathModel // what the prompt key is scoped to, below
	}
	info.Stream = b.stream
	// n choices are each generated up to the bound, for each prompt of a
	// batch; n is capped at 128, the OpenAI API's limit, so a made-up n
	// cannot claim an endpoint's whole capacity beyond what a made-up bound
	// already can. The product of a bound below 2^31, n and prompts up to
	// MaxTokenEstimate stays below 2^60: a million prompts cannot overflow
	// it, and it is capped as every estimate is.
	prompts := min(max(b.prompts, 1), MaxTokenEstimate)
	info.MaxOutputTokens = int(min(int64(b.maxTokens)*int64(min(max(b.n, 1), maxChoices))*int64(prompts), MaxTokenEstimate))
	chars := b.chars
	switch {
	case complete:
	case b.sized:
		// The whole body was read past the peek: its size but for the
		// data URLs, "data" members and "images" lists (base64 images or audio, which
		// are not prompt text: a 1.5 MB photo is some thousand tokens,
		// not 400,000).
		chars = max(chars, idScaled(min(b.textSize, 1<<40), &b, len(peek)))
	default:
		// Text dominates an AI request body, so the whole body's size is a
		// better estimate than the part of it the peek saw, less the
		// base64 the peek shows it to carry (peekText).
		chars = max(chars, idScaled(peekText(peek, r.ContentLength), &b, len(peek)))
	}
	info.PromptTokens = min(chars/charsPerToken, MaxTokenEstimate)
	if info.Service == inferlb.ServiceEmbedding || info.Service == inferlb.ServiceRerank {
		// A pooling server bounds each input (query and document pair) by
		// its window, not the batch. One input, or one document with its
		// query, is the call's estimate; of a batch, the largest the peek
		// holds (a lower bound when the batch runs past it).
		if b.inputs <= 1 {
			info.LongestInput = info.PromptTokens
		} else {
			info.LongestInput = min((b.query+b.input)/charsPerToken, MaxTokenEstimate)
		}
	}
	if info.Service == inferlb.ServiceLLM && (b.n > 1 || prompts > 1) {
		// Several sequences, n choices of each prompt of a batch: a
		// server bounds each, one prompt with the output bound of one,
		// by its window, not their sum (see inferlb.Request.LongestInput).
		// The longest prompt of a batch is of those the peek holds.
		info.SequenceOutputTokens = int32(min(max(b.maxTokens, 0), MaxTokenEstimate))
		info.LongestInput = info.PromptTokens
		if prompts > 1 {
			info.LongestInput = min(b.input/charsPerToken, MaxTokenEstimate)
		}
		info.LongestInput = max(info.LongestInput, 1)
	}
	if info.Service != inferlb.ServiceLLM || o.Keyer == nil {
		return
	}
	if b.cacheSalt != "" {
		info.salt = saltTag(o.Keyer, b.cacheSalt) // for a session header (sessionKey)
	}
	var prevKey uint64 // a Responses API follow-up's: the key of the turn it continues
	if b.prevResponse != "" {
		// The response it continues is stored where it was made: the
		// follow-up goes there whatever its key (a prompt_cache_key,
		// which a client that sets one per conversation sends with
		// every turn, goes where the key goes, which a spill moves).
		var serial uint32
		if prevKey, serial, _ = o.chains.lookup(o.Keyer.Session(b.prevResponse)); prevKey != 0 {
			info.pin = serial
		}
	}
	if b.cacheKey == "" && b.conversation != "" {
		// A Responses API conversation names its session outright.
		info.AffinityKey = o.Keyer.Salted(o.Keyer.Session(b.conversation), b.cacheSalt)
		info.Session = true
		return
	}
	if b.cacheKey == "" && prevKey != 0 {
		info.AffinityKey = prevKey
		return
	}
	// A Responses API conversation may start with a string input and go on
	// with input items (the history resent): the string is its first user
	// message, keyed as the items will be, so both turns share a key.
	responses := b.hasText && isResponses(r.URL.Path)
	switch {
	case b.cacheKey != "":
		info.AffinityKey, info.Session = o.Keyer.Session(b.cacheKey), true
	case b.messageCount() > 0 || b.system != "" || responses:
		msgs := b.msgs[:b.nmsg] // on this stack; Keyer.Chat retains nothing
		if b.system != "" || b.hasText || len(b.more) > 0 {
			// /v1/responses (instructions, input items or text), or more
			// messages than msgs holds.
			var buf [len(b.msgs) + 2]cache.Message
			msgs = buf[:0]
			if b.system != "" {
				msgs = append(msgs, cache.Message{Role: "system", Content: b.system})
			}
			msgs = append(msgs, b.msgs[:b.nmsg]...)
			msgs = append(msgs, b.more...)
			if b.hasText {
				msgs = append(msgs, cache.Message{Role: "user", Content: b.prompt})
			}
		}
		info.AffinityKey = o.Keyer.Chat(b.model, msgs)
	case b.hasText:
		info.AffinityKey = o.Keyer.Prompt(b.model, b.prompt)
	}
	if b.images != 0 && !info.Session {
		// Ollama's /api/generate: the photos asked about count in the
		// prompt's key, as a chat message's images do.
		var tag [len(imagesTag) + 8]byte
		binary.LittleEndian.PutUint64(tag[copy(tag[:], imagesTag):], b.images)
		info.AffinityKey = o.Keyer.Salted(info.AffinityKey, string(tag[:]))
	}
	// vLLM's cache_salt: other salts share no cache with this one. (A
	// follow-up pinned above kept the key of the turn it continues, which
	// was salted alike.)
	info.AffinityKey = o.Keyer.Salted(info.AffinityKey, b.cacheSalt)
}

// imagesTag opens the salt that scopes a prompt's key by its images: no
// cache_salt a client sends is spelled so.
const imagesTag = "\x00images\x00"

// saltTag is a 24-bit digest of a cache salt under k's seed, never zero
// (the salt is not empty). Info has room for three bytes, not for the salt.
func saltTag(k *cache.Keyer, salt string) [3]byte {
	h := k.Salted(1, salt) // the salt's own hash
	t := [3]byte{byte(h), byte(h >> 8), byte(h >> 16)}
	if t == ([3]byte{}) {
		t[0] = 1
	}
	return t
}

// sessionKey is the affinity key of a session header's value id: the
// Keyer's session key, scoped by the body's cache_salt when Inspect
// recorded one (salt), so that tenants who pick the same session ID do not
// share a key the server's cache does not let them share.
func (info *Info) sessionKey(k *cache.Keyer, id string) uint64 {
	key := k.Session(id)
	if info.salt != ([3]byte{}) {
		key = k.Salted(key, string(info.salt[:]))
	}
	return key
}
