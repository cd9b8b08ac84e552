package main

import (
	"bufio"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/capledger/capledger/client"
)

// redisTokenBucket is the baseline a team would write on Redis: a token
// bucket per key in one Lua script, refilled from the server's clock,
// answering 1 (admitted) or 0. The bucket is a hash {tokens, at}; rate is
// tokens per millisecond. With --appendonly yes --appendfsync always Redis
// fsyncs its append-only file before it answers, which makes the decision
// as durable as capledger's.
const redisTokenBucket = `
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local b = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(b[1]) or burst
local at = tonumber(b[2]) or now
tokens = math.min(burst, tokens + (now - at) * rate)
local ok = 0
if tokens >= cost then
  tokens = tokens - cost
  ok = 1
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'at', now)
return ok
`

// redisConn is one connection speaking RESP2, enough for SCRIPT LOAD and
// EVALSHA: commands are written as arrays of bulk strings, and answers
// read as one simple string, error, integer or bulk string each.
type redisConn struct {
	conn net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
}

func dialRedis(ctx context.Context, addr string, timeout time.Duration) (*redisConn, error) {
	addr = strings.TrimPrefix(addr, "redis://")
	d := net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	c, err := d.DialContext(ctx, "tcp", strings.TrimRight(addr, "/"))
	if err != nil {
		return nil, fmt.Errorf("redis %s: %w", addr, err)
	}
	return &redisConn{conn: c, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, 64<<10)}, nil
}

// send buffers one command; flush writes what is buffered.
func (c *redisConn) send(args ...string) {
	c.w.WriteByte('*')
	c.w.WriteString(strconv.Itoa(len(args)))
	c.w.WriteString("\r\n")
	for _, a := range args {
		c.w.WriteByte('$')
		c.w.WriteString(strconv.Itoa(len(a)))
		c.w.WriteString("\r\n")
		c.w.WriteString(a)
		c.w.WriteString("\r\n")
	}
}

// redisError is an error answer (-ERR ..., -NOSCRIPT ...).
type redisError string

func (e redisError) Error() string { return "redis: " + string(e) }

// receive reads one answer: an integer as int64, a simple or bulk string
// as string, nil for a null bulk string, and an error answer as a
// redisError.
func (c *redisConn) receive() (any, error) {
	line, err := c.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("redis: malformed answer %q", line)
	}
	body := line[1 : len(line)-2]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return nil, redisError(body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < -1 {
			return nil, fmt.Errorf("redis: bad bulk length %q", body)
		}
		if n == -1 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := ioReadFull(c.r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	default:
		return nil, fmt.Errorf("redis: unsupported answer type %q", line[0])
	}
}

func ioReadFull(r *bufio.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// roundTrip sends the buffered commands (count answers expected) with
// deadline ctx's and returns how many answered 1.
func (c *redisConn) roundTrip(ctx context.Context, count int) (admitted int, err error) {
	if d, ok := ctx.Deadline(); ok {
		c.conn.SetDeadline(d)
	} else {
		c.conn.SetDeadline(time.Time{})
	}
	if err := c.w.Flush(); err != nil {
		return 0, err
	}
	var firstErr error
	for range count {
		v, err := c.receive()
		var re redisError
		switch {
		case errors.As(err, &re):
			if firstErr == nil {
				firstErr = err
			}
		case err != nil:
			return admitted, err // the connection is out of step now
		case v == int64(1):
			admitted++
		}
	}
	return admitted, firstErr
}

// redisOp loads the token bucket script into the Redis at --addr and
// returns an op that calls it by EVALSHA on its worker's own connection
// (a pool of --concurrency connections, as a Redis client keeps): one
// call per op in --mode redis, --batch-size calls pipelined in one write
// per op in --mode redis-batch (what a gateway would do for a batch; the
// answers come back in order). The bucket admits everything a run asks
// for, as the bench policy does, so every call writes its key.
func redisOp(ctx context.Context, cfg *benchConfig) (func(context.Context, *benchWorker) (int, error), error) {
	timeout := cfg.conn.timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	setup, err := dialRedis(ctx, cfg.conn.addr, timeout)
	if err != nil {
		return nil, err
	}
	defer setup.conn.Close()
	sum := sha1.Sum([]byte(redisTokenBucket))
	sha := hex.EncodeToString(sum[:])
	setup.send("SCRIPT", "LOAD", redisTokenBucket)
	if err := setup.conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	if err := setup.w.Flush(); err != nil {
		return nil, fmt.Errorf("redis script load: %w", err)
	}
	got, err := setup.receive()
	if err != nil {
		return nil, fmt.Errorf("redis script load: %w", err)
	}
	if got != sha {
		return nil, fmt.Errorf("redis script load: sha %v, want %s", got, sha)
	}
	var mu sync.Mutex
	conns := map[int]*redisConn{}
	conn := func(ctx context.Context, w *benchWorker) (*redisConn, error) {
		mu.Lock()
		defer mu.Unlock()
		if c := conns[w.index]; c != nil {
			return c, nil
		}
		c, err := dialRedis(ctx, cfg.conn.addr, timeout)
		if err != nil {
			return nil, err
		}
		conns[w.index] = c
		return c, nil
	}
	perOp := 1
	if cfg.mode == "redis-batch" {
		perOp = cfg.batchSize
	}
	cost := strconv.FormatInt(cfg.units, 10)
	const rate, burst = "1099511627776", "1125899906842624" // as the bench policy: nothing runs out
	return func(ctx context.Context, w *benchWorker) (int, error) {
		c, err := conn(ctx, w)
		if err != nil {
			return 0, err
		}
		for range perOp {
			c.send("EVALSHA", sha, "1", "bucket:"+cfg.route+":"+w.subject(cfg), rate, burst, cost)
		}
		callCtx, cancel := context.WithTimeout(ctx, timeout)
		admitted, err := c.roundTrip(callCtx, perOp)
		cancel()
		if err != nil {
			var re redisError
			if !errors.As(err, &re) {
				// A broken connection is out of step: dial anew next time.
				mu.Lock()
				delete(conns, w.index)
				mu.Unlock()
				c.conn.Close()
			}
			return admitted, err
		}
		if admitted < perOp {
			return admitted, &client.RejectedError{}
		}
		return admitted, nil
	}, nil
}
