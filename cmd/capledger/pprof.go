package main

import (
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
)

// serveProfiles serves Go's runtime profiles (net/http/pprof) on addr,
// a listener of their own beside the API's port, for `serve
// --pprof-addr` (docs/OPERATIONS.md, "Profiling serve"). The address
// must be a loopback one: the profiles show the process's internals and
// take no token. It returns a function that closes the listener.
func serveProfiles(addr string, log *slog.Logger) (func(), error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, usagef("--pprof-addr %q: %v", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, usagef("--pprof-addr %s: want a loopback address (the profiles take no token)", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, usagef("--pprof-addr: %v", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	log.Info("serving profiles", "addr", ln.Addr().String(), "path", "/debug/pprof/")
	return func() { srv.Close() }, nil
}
