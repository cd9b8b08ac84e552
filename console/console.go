// Package console serves the operator console: a few static files (HTML,
// CSS, JavaScript and the vendored uPlot chart library) embedded in the
// binary, so `capledger serve` shows it at /ui with no build step, no CDN
// and no network beyond its own port.
//
// The page is a client of the public JSON API: it calls the LedgerService,
// ShardService, RolloutService and ConsoleService over Connect JSON with
// the token the operator typed in (kept in the browser's sessionStorage),
// exactly as curl would. Nothing here reads the ledger; this package imports nothing of
// capledger's, and cmd mounts it on the server's port (docs/CONSOLE.md).
package console

import (
	"embed"
	"io/fs"
	"net/http"
)

// Prefix is where the console is served.
const Prefix = "/ui/"

//go:embed assets
var assets embed.FS

// UPlotVersion is the vendored uPlot release (assets/vendor/uplot;
// docs/CONSOLE.md, "Updating uPlot", says how to move to another one).
const UPlotVersion = "1.6.32"

// Handler serves the console's files under Prefix and redirects the bare
// /ui to it, keeping the query (a link's /ui?x=1 arrives as /ui/?x=1; the
// browser keeps the #page itself). Mount it for both "/ui" and "/ui/".
func Handler() http.Handler {
	root, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.StripPrefix(Prefix, http.FileServerFS(root))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "the console's files are read with GET", http.StatusMethodNotAllowed)
			return
		}
		if r.URL.Path == "/ui" {
			target := Prefix
			if r.URL.RawQuery != "" {
				target += "?" + r.URL.RawQuery
			}
			http.Redirect(w, r, target, http.StatusMovedPermanently)
			return
		}
		h := w.Header()
		// Only this origin's scripts run and only this origin is called:
		// the token typed in cannot be sent anywhere else. uPlot sizes its
		// elements through style properties, hence the inline styles.
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "+
			"img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		// The files change with the binary: revalidate, so an upgrade is
		// seen at the next load.
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
