package promapi_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/promapi"
)

// answerFunc is an http.RoundTripper that answers every request with the
// same status and body, without a network.
type answerFunc func() (int, []byte)

func (f answerFunc) RoundTrip(r *http.Request) (*http.Response, error) {
	status, body := f()
	return &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)), Request: r}, nil
}

// FuzzCollect: whatever a Prometheus server (or what stands in front of
// one) answers, Collect reads it the same way each time; gives
// observations only with no error or a partial one, and only of an answer
// that is a JSON object, read to its end; never more than MaxEndpoints,
// one an endpoint, each with a field and values a server can report; and
// of an answer that is a well-formed vector (as encoding/json reads it,
// with its keys spelt as Prometheus spells them) it reads without
// failing, only endpoints its series name.
func FuzzCollect(f *testing.F) {
	for _, s := range []string{
		okBody,
		`{"status":"success","data":{"resultType":"vector","result":null}}`,
		`{"status":"error","errorType":"bad_data","error":"parse error"}`,
		`{"status":"success","warnings":["partial"],"data":{"resultType":"vector","result":[{"metric":{"instance":"a","inferlb_field":"waiting"},"value":[1767225600,"3"]}]}}`,
		`{"status":"success","data":{"resultType":"matrix","result":[]}}`,
		`{"status":"success","data":{"resultType":"vector","result":[{"metric":{"instance":5,"inferlb_field":"waiting"},"value":[1767225600,"9"]},{"metric":{"instance":"b","inferlb_field":"running"},"value":[1e10,"4"]}]}}`,
		`{"status":"success","data":{"resultType":"vector","result":[{"metric":{"instance":"a","inferlb_time":"waiting"},"value":[1767225600,"1767225500.5"]},{"metric":{"instance":"a","inferlb_field":"waiting"},"value":[1767225600,"2"]}]}}`,
		`{"status":"success","data":{"resultType":"vector","result":[{"metric":{"instance":"a","inferlb_field":"lora_slots","running_lora_adapters":"x,y","waiting_lora_adapters":"","model_name":"base"},"value":[1767225600,"4"]},{"metric":{"instance":"a","inferlb_field":"running"},"value":[1767225600,"0"]}]}}`,
		`{"status":"success","data":{"resultType":"vector","result":[{"metric":{"instance":"a","inferlb_field":"kv_cache_preallocated"},"value":[1767225600,"1"]}]}} trailing`,
		`{"status":"success","data":{"resultType":"vector","result":[`,
		`[]`, `null`, ``,
	} {
		f.Add([]byte(s), uint8(0))
	}
	f.Add([]byte(okBody), uint8(1))
	f.Fuzz(func(t *testing.T, body []byte, st uint8) {
		status := []int{200, 503, 400, 204}[st%4]
		src := &promapi.Source{URL: "http://prometheus.internal/", Client: &http.Client{
			Transport: answerFunc(func() (int, []byte) { return status, body })}}
		obs, err := src.Collect(t.Context())
		again, err2 := src.Collect(t.Context())
		if !reflect.DeepEqual(obs, again) || (err == nil) != (err2 == nil) || err != nil && err.Error() != err2.Error() {
			t.Fatalf("%q read twice: %v (%v), then %v (%v)", body, obs, err, again, err2)
		}
		if err != nil && !errors.Is(err, telemetry.ErrPartial) {
			if len(obs) > 0 {
				t.Fatalf("%q: %d observations with the error %v", body, len(obs), err)
			}
		} else {
			var first json.RawMessage
			if dec := json.NewDecoder(bytes.NewReader(body)); dec.Decode(&first) != nil || len(first) == 0 || first[0] != '{' {
				t.Fatalf("%q: read (%v) though it holds no JSON object", body, err)
			}
		}
		if len(obs) > promapi.MaxEndpoints {
			t.Fatalf("%d observations", len(obs))
		}
		ids := map[string]bool{}
		for _, o := range obs {
			if o.EndpointID == "" || ids[o.EndpointID] {
				t.Fatalf("%q: endpoint ID %q empty or twice", body, o.EndpointID)
			}
			ids[o.EndpointID] = true
			if o.Sample.Empty() {
				t.Fatalf("%q: %s has no field", body, o.EndpointID)
			}
			for fl := range telemetry.NumFields {
				v, ok := o.Sample.Get(telemetry.Field(fl))
				if !ok {
					continue
				}
				switch telemetry.Field(fl) {
				case telemetry.KVCacheUsage, telemetry.PrefixCacheHitRate, telemetry.GPUUtil:
					if v < 0 || v > 1 {
						t.Fatalf("%q: %s %v", body, telemetry.Field(fl), v)
					}
				case telemetry.Running, telemetry.Waiting:
					if v < 0 {
						t.Fatalf("%q: %s %v", body, telemetry.Field(fl), v)
					}
				}
				if math.IsNaN(v) || math.IsInf(v, 0) {
					t.Fatalf("%q: %s %v", body, telemetry.Field(fl), v)
				}
			}
		}

		// A well-formed vector, as encoding/json reads it.
		var ans struct {
			Status string `json:"status"`
			Data   *struct {
				ResultType string `json:"resultType"`
				Result     []struct {
					Metric map[string]string `json:"metric"`
					Value  [2]any            `json:"value"`
				} `json:"result"`
			} `json:"data"`
		}
		if status != 200 || json.Unmarshal(body, &ans) != nil || ans.Status != "success" || ans.Data == nil || ans.Data.ResultType != "vector" ||
			!exactKeys(body, "status", "data", "warnings", "error", "errorType") {
			return
		}
		var top struct {
			Data json.RawMessage `json:"data"`
		}
		var data struct {
			Result []json.RawMessage `json:"result"`
		}
		if json.Unmarshal(body, &top) != nil || json.Unmarshal(top.Data, &data) != nil || !exactKeys(top.Data, "resultType", "result") {
			return
		}
		for _, s := range data.Result {
			if !exactKeys(s, "metric", "value") {
				return
			}
		}
		if err != nil && !errors.Is(err, telemetry.ErrPartial) {
			t.Fatalf("%q: a well-formed answer refused: %v", body, err)
		}
		named := map[string]bool{}
		for _, s := range ans.Data.Result {
			named[s.Metric[promapi.DefaultEndpointLabel]] = true
		}
		for id := range ids {
			if !named[id] {
				t.Fatalf("%q: an observation of %q, which no series names", body, id)
			}
		}
	})
}

// exactKeys reports whether the JSON object raw spells each of keys as
// given where it has it: encoding/json matches a key in any case
// ("stAtus"), Prometheus writes them so, and Collect reads them so.
func exactKeys(raw []byte, keys ...string) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return false
	}
	for k := range m {
		for _, want := range keys {
			if k != want && strings.EqualFold(k, want) {
				return false
			}
		}
	}
	return true
}
