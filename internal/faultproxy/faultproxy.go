// Package faultproxy is a TCP proxy that injects network faults between a
// client and a server: it swallows answers after the server produced them
// (lost answers), swallows requests before the server sees them, cuts
// connections half way through a message, delays bytes, and partitions.
//
// It works on the byte stream, below HTTP, so every protocol (HTTP/1.1,
// h2c, gRPC) meets the same faults a real network produces: a request
// whose answer is swallowed HAS been applied by the server, which is
// exactly the situation idempotent retries must survive.
package faultproxy

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Faults are probabilities per chunk (one read from a socket, typically
// one small message) and delays. The zero value forwards everything.
type Faults struct {
	// DropResponse: a server->client chunk is swallowed and the connection
	// cut. The server has done the work; the client never hears of it.
	DropResponse float64
	// TruncateResponse: the first half of a server->client chunk is
	// forwarded, then the connection is cut (a torn answer).
	TruncateResponse float64
	// DropRequest: a client->server chunk is swallowed and the connection
	// cut before the server sees it.
	DropRequest float64
	// Delay is added before forwarding a chunk, with probability
	// DelayProbability (0 with a positive Delay: every chunk).
	Delay            time.Duration
	DelayProbability float64
	// Partition swallows every chunk in both directions without closing
	// anything, so callers wait for their timeouts. Connections that lost
	// bytes this way are cut when the partition is lifted (their streams
	// are torn).
	Partition bool
}

// Stats counts what the proxy did.
type Stats struct {
	Accepted          int64
	ForwardedChunks   int64
	DroppedResponses  int64
	TruncatedResponse int64
	DroppedRequests   int64
	Delayed           int64
	Partitioned       int64
	Cut               int64
}

// Faulted returns the number of injected faults that lose or tear a
// message (delays not counted).
func (s Stats) Faulted() int64 {
	return s.DroppedResponses + s.TruncatedResponse + s.DroppedRequests + s.Partitioned
}

// Proxy forwards connections from its listener to a target address.
type Proxy struct {
	target   string
	listener net.Listener

	mu     sync.Mutex
	faults Faults
	// dropNextResponses / dropNextRequests are one-shot faults that win
	// over the probabilities.
	dropNextResponses, dropNextRequests int
	rng                                 *rand.Rand
	conns                               map[*link]struct{}
	closed                              bool

	accepted, forwarded, droppedResp, truncated, droppedReq, delayed, partitioned, cut atomic.Int64
	wg                                                                                 sync.WaitGroup
}

// link is one proxied connection pair.
type link struct {
	client, server net.Conn
	once           sync.Once
	torn           atomic.Bool  // lost bytes in a partition
	ended          atomic.Int32 // pumps that ended by a clean end of stream
}

// close closes both ends once, running counted (when not nil) first, so
// that whoever sees the connection end also sees the proxy's count of it.
func (l *link) close(counted func()) bool {
	first := false
	l.once.Do(func() {
		first = true
		if counted != nil {
			counted()
		}
		l.client.Close()
		l.server.Close()
	})
	return first
}

// Start listens on 127.0.0.1 (a free port) and forwards every accepted
// connection to target. seed makes the fault draws reproducible for a
// given interleaving. It returns the running proxy or the listen error.
func Start(target string, seed uint64) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		target:   target,
		listener: ln,
		rng:      rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		conns:    make(map[*link]struct{}),
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.listener.Addr().String() }

// SetFaults replaces the faults from now on. Lifting a partition cuts the
// connections it tore.
func (p *Proxy) SetFaults(f Faults) {
	p.mu.Lock()
	wasPartitioned := p.faults.Partition
	p.faults = f
	var torn []*link
	if wasPartitioned && !f.Partition {
		for l := range p.conns {
			if l.torn.Load() {
				torn = append(torn, l)
			}
		}
	}
	p.mu.Unlock()
	for _, l := range torn {
		p.cutLink(l)
	}
}

// DropNextResponses makes the next n server->client chunks be swallowed,
// each cutting its connection: n answers the server produced are lost.
func (p *Proxy) DropNextResponses(n int) {
	p.mu.Lock()
	p.dropNextResponses = n
	p.mu.Unlock()
}

// DropNextRequests makes the next n client->server chunks be swallowed,
// each cutting its connection before the server sees the bytes.
func (p *Proxy) DropNextRequests(n int) {
	p.mu.Lock()
	p.dropNextRequests = n
	p.mu.Unlock()
}

// CutAll closes every open connection now, as a crashed middlebox would.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		p.cutLink(l)
	}
}

// Stats returns the counters so far.
func (p *Proxy) Stats() Stats {
	return Stats{
		Accepted:          p.accepted.Load(),
		ForwardedChunks:   p.forwarded.Load(),
		DroppedResponses:  p.droppedResp.Load(),
		TruncatedResponse: p.truncated.Load(),
		DroppedRequests:   p.droppedReq.Load(),
		Delayed:           p.delayed.Load(),
		Partitioned:       p.partitioned.Load(),
		Cut:               p.cut.Load(),
	}
}

// Close stops accepting, cuts every connection and waits for the
// forwarding goroutines. It returns nil.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.listener.Close()
	p.CutAll()
	p.wg.Wait()
	return nil
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.listener.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		s, err := net.DialTimeout("tcp", p.target, 3*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		l := &link{client: c, server: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			l.close(nil)
			return
		}
		p.conns[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pump(l, c, s, false)
		go p.pump(l, s, c, true)
	}
}

func (p *Proxy) cutLink(l *link) {
	l.close(func() { p.cut.Add(1) })
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
}

// decision is what happens to one chunk.
type decision int

const (
	forward decision = iota
	drop
	truncate
	swallow // partition: lose it, keep the connection open
)

func (p *Proxy) decide(response bool) (decision, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.faults
	if f.Partition {
		return swallow, 0
	}
	if response && p.dropNextResponses > 0 {
		p.dropNextResponses--
		return drop, 0
	}
	if !response && p.dropNextRequests > 0 {
		p.dropNextRequests--
		return drop, 0
	}
	var delay time.Duration
	if f.Delay > 0 && (f.DelayProbability == 0 || p.rng.Float64() < f.DelayProbability) {
		delay = f.Delay
	}
	if response {
		x := p.rng.Float64()
		switch {
		case x < f.DropResponse:
			return drop, delay
		case x < f.DropResponse+f.TruncateResponse:
			return truncate, delay
		}
	} else if p.rng.Float64() < f.DropRequest {
		return drop, delay
	}
	return forward, delay
}

// pump copies from src to dst chunk by chunk, applying faults. response is
// true for the server->client direction.
func (p *Proxy) pump(l *link, src, dst net.Conn, response bool) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			d, delay := p.decide(response)
			if delay > 0 {
				p.delayed.Add(1)
				time.Sleep(delay)
			}
			switch d {
			case swallow:
				p.partitioned.Add(1)
				l.torn.Store(true)
				continue
			case drop:
				if response {
					p.droppedResp.Add(1)
				} else {
					p.droppedReq.Add(1)
				}
				p.cutLink(l)
				return
			case truncate:
				p.truncated.Add(1)
				_, _ = dst.Write(buf[:n/2])
				p.cutLink(l)
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				p.endLink(l)
				return
			}
			p.forwarded.Add(1)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				// Half close: pass the end of stream on and let the other
				// direction finish; the second pump to end closes both.
				if tc, ok := dst.(*net.TCPConn); ok && tc.CloseWrite() == nil {
					if l.ended.Add(1) == 2 {
						p.endLink(l)
					}
					return
				}
			}
			p.endLink(l)
			return
		}
	}
}

// endLink closes a link that ended on its own (not an injected cut).
func (p *Proxy) endLink(l *link) {
	l.close(nil)
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
}
