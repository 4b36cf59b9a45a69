package promtext

import "testing"

func TestURLKey(t *testing.T) {
	same := [][]string{
		{"http://10.0.1.7:9400/metrics", "HTTP://10.0.1.7:9400/metrics", "http://10.0.1.7:9400/metrics#x"},
		{"http://Node-A/metrics", "http://node-a:80/metrics"},
		{"https://node-a/metrics", "https://node-a:443/metrics"},
		{"http://node-a:9400", "http://node-a:9400/"},
		{"http://[::1]:9400/metrics", "http://[::1]:9400/metrics"},
		{"http://[FE80::1]/metrics", "http://[fe80::1]:80/metrics"},
	}
	for _, urls := range same {
		for _, u := range urls[1:] {
			if URLKey(u) != URLKey(urls[0]) {
				t.Errorf("URLKey(%q) = %q, URLKey(%q) = %q: want the same", u, URLKey(u), urls[0], URLKey(urls[0]))
			}
		}
	}
	differ := [][2]string{
		{"http://node-a:9400/metrics", "https://node-a:9400/metrics"},
		{"http://node-a:9400/metrics", "http://node-a:9401/metrics"},
		{"http://node-a:9400/metrics", "http://node-a:9400/Metrics"},
		{"http://node-a:9400/metrics", "http://node-a:9400/metrics?x=1"},
		{"http://node-a:443/metrics", "http://node-a/metrics"},
		{"::bad", "::bad2"},
	}
	for _, d := range differ {
		if URLKey(d[0]) == URLKey(d[1]) {
			t.Errorf("URLKey(%q) = URLKey(%q) = %q: want different", d[0], d[1], URLKey(d[0]))
		}
	}
}

func TestRedacted(t *testing.T) {
	for in, want := range map[string]string{
		"http://node-a:9400/metrics":           "http://node-a:9400/metrics",
		"http://scraper:s3cr3t@node-a/metrics": "http://scraper:xxxxx@node-a/metrics",
		"http://scraper@node-a/metrics":        "http://scraper@node-a/metrics",
		"http://scraper:s3cr3t@node-a:bad/m":   "http://xxxxx@node-a:bad/m", // does not parse
		"http://scraper:s3:cr@t@node-a:bad":    "http://xxxxx@node-a:bad",
		"not a url":                            "not a url",
	} {
		if got := Redacted(in); got != want {
			t.Errorf("Redacted(%q) = %q, want %q", in, got, want)
		}
	}
}
