package promtext

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
)

// URLKey names the resource raw points at, so that two spellings of one
// target's URL are scraped once: scheme and host in lower case, no default
// port, "/" for an empty path, no fragment. A URL that does not parse is
// its own key.
func URLKey(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return raw
	}
	u.Scheme = strings.ToLower(u.Scheme)
	host, port := strings.ToLower(u.Hostname()), u.Port()
	if port == "80" && u.Scheme == "http" || port == "443" && u.Scheme == "https" {
		port = ""
	}
	if port != "" || strings.Contains(host, ":") {
		host = net.JoinHostPort(host, port)
		host = strings.TrimSuffix(host, ":") // an IPv6 literal without a port
	}
	u.Host = host
	if u.Path == "" && u.RawPath == "" {
		u.Path = "/"
	}
	u.Fragment, u.RawFragment = "", ""
	return u.String()
}

// Redacted returns raw for an error message: with the password of its user
// information replaced by "xxxxx", as net/http's own errors name a URL, so
// that errors (which OnError callbacks log) never carry a scrape target's
// credentials. A URL that does not parse loses all of its user information.
func Redacted(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		if _, has := u.User.Password(); !has {
			return raw
		}
		return u.Redacted()
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	authority, path, slash := strings.Cut(rest, "/")
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		authority = "xxxxx" + authority[i:]
	}
	if slash {
		return scheme + "://" + authority + "/" + path
	}
	return scheme + "://" + authority
}

// parseCause returns what url.Parse found wrong with a URL, without the URL
// its error quotes (as given, password and all): err's own cause when it is
// a *url.Error, else err.
func parseCause(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return ue.Err
	}
	return err
}

// CheckURL reports whether raw is an http or https URL with a host, as a
// scrape target must be; the error names it with its password redacted.
func CheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || !strings.EqualFold(u.Scheme, "http") && !strings.EqualFold(u.Scheme, "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http or https URL", Redacted(raw))
	}
	return nil
}

// CheckLimits checks a scraping Source's Parallelism and MaxBodyBytes (0
// for their defaults, never negative); pkg names the Source's package in
// the error.
func CheckLimits(pkg string, parallelism int, maxBodyBytes int64) error {
	switch {
	case parallelism < 0:
		return fmt.Errorf("%s: Source.Parallelism is %d, want >= 0 (0 for DefaultParallelism)", pkg, parallelism)
	case maxBodyBytes < 0:
		return fmt.Errorf("%s: Source.MaxBodyBytes is %d, want >= 0 (0 for the default)", pkg, maxBodyBytes)
	}
	return nil
}
