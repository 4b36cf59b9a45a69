package promtext

import (
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
