package main

import (
	"embed"
	"io/fs"
	"net/http"
)

// webFiles are the page: HTML, CSS and JavaScript with no build step, and
// nothing loaded from elsewhere.
//
//go:embed web
var webFiles embed.FS

// contentSecurityPolicy lets the page load only its own files, which is
// all it needs: no CDN, no external fonts, no inline script.
const contentSecurityPolicy = "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// staticFiles serves the page at / and its assets beside it.
func staticFiles() http.Handler {
	root, err := fs.Sub(webFiles, "web")
	if err != nil { // "web" is a valid path: fs.Sub cannot fail on it
		panic(err)
	}
	files := http.FileServerFS(root)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
