package servers

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a TCP proxy on a free 127.0.0.1 port in front of a server,
// started by [StartProxy], that can stall the replies to chosen requests:
// see [Proxy.StallAfter].
//
// That is a server that answers only after the client has given up, made
// deterministic. Unlike a paused server, it lets a client that retries on
// a new connection get through its handshake and send the request again,
// so a test sees every retry charged, without racing the client's timeout
// against a server waking up.
type Proxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	marked atomic.Int64 // requests with a mark passed on since StallAfter

	mu     sync.Mutex
	marks  [][]byte // upper-cased; see StallAfter
	conns  map[*proxyConn]struct{}
	closed bool
}

// proxyConn is one client connection and the proxy's own to the target.
type proxyConn struct {
	client, server net.Conn
	marked         *atomic.Int64 // the proxy's count

	mu      sync.Mutex
	resumed sync.Cond // signalled when stalled or closed changes
	marks   [][]byte  // the proxy's, when the connection last looked
	carry   []byte    // the end of what the client sent last, upper-cased
	stalled bool
	closed  bool
}

// proxyDialTimeout bounds the proxy's dial of its target for each client
// connection; a client whose dial fails sees its connection closed.
const proxyDialTimeout = 5 * time.Second

// StartProxy starts a Proxy to target, a "host:port" address.
// t.Cleanup closes it and every connection through it.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("servers: proxy to %s: %v", target, err)
	}
	p := &Proxy{target: target, ln: ln, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr returns the proxy's "127.0.0.1:port" address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port returns the port of Addr.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// StallAfter stalls the replies on every connection, open or new, from
// the first request that contains one of marks (in any case) sent from now
// on: the server gets the request, and runs it, but neither its reply nor
// any after it reach the client until Release. Replies to the requests
// before it, such as a new connection's handshake, pass. [Proxy.Marked]
// counts the requests with a mark from now on.
func (p *Proxy) StallAfter(marks ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marked.Store(0)
	p.marks = nil
	for _, m := range marks {
		p.marks = append(p.marks, bytes.ToUpper([]byte(m)))
	}
	for c := range p.conns {
		c.mu.Lock()
		c.marks, c.carry = p.marks, nil
		c.mu.Unlock()
	}
}

// Marked returns how many times the proxy has passed a mark of the last
// StallAfter on to the server, on any connection, up to its Release: the
// requests of that kind that the client sent, each of which the server
// runs.
func (p *Proxy) Marked() int { return int(p.marked.Load()) }

// Release ends the stall: the replies held back flow again, and no
// request stalls its connection.
func (p *Proxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marks = nil
	for c := range p.conns {
		c.mu.Lock()
		c.marks, c.carry, c.stalled = nil, nil, false
		c.resumed.Broadcast()
		c.mu.Unlock()
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Add(1)
		go p.serve(client)
	}
}

// serve connects client to the target and copies both ways until either
// side closes.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.target, proxyDialTimeout)
	if err != nil {
		client.Close()
		return
	}
	c := &proxyConn{client: client, server: server, marked: &p.marked}
	c.resumed.L = &c.mu
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.close()
		return
	}
	p.conns[c] = struct{}{}
	c.marks = p.marks
	p.mu.Unlock()

	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		c.up()
	}()
	c.down()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// up copies what the client sends to the server, stalled or not, once it
// has looked for marks in it. When the client closes, the server still
// gets what it sent before.
func (c *proxyConn) up() {
	buf := make([]byte, 32<<10)
	for {
		n, err := c.client.Read(buf)
		if n > 0 {
			c.watch(buf[:n])
			if _, werr := c.server.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	c.close()
}

// watch counts the marks in b, and what came just before it, and stalls
// the connection at the first. It runs before b goes to the server, so
// the server cannot reply before the stall is in place.
func (c *proxyConn) watch(b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.marks) == 0 {
		return
	}
	window := append(c.carry, bytes.ToUpper(b)...)
	longest := 0
	for _, m := range c.marks {
		// A mark that ends within the carry was counted with the chunk
		// before.
		for i := 0; ; {
			j := bytes.Index(window[i:], m)
			if j < 0 {
				break
			}
			if i+j+len(m) > len(c.carry) {
				c.marked.Add(1)
				c.stalled = true
			}
			i += j + 1
		}
		longest = max(longest, len(m))
	}
	c.carry = bytes.Clone(window[max(0, len(window)-longest+1):])
}

// down copies the server's replies to the client, waiting while stalled.
func (c *proxyConn) down() {
	buf := make([]byte, 32<<10)
	for {
		n, err := c.server.Read(buf)
		if n > 0 && !c.deliver(buf[:n]) {
			break
		}
		if err != nil {
			break
		}
	}
	c.close()
}

// deliver writes b to the client once the connection is not stalled, and
// reports whether it could.
func (c *proxyConn) deliver(b []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.stalled && !c.closed {
		c.resumed.Wait()
	}
	if c.closed {
		return false
	}
	_, err := c.client.Write(b)
	return err == nil
}

// close closes both sides, which ends both copies: the sockets first, so
// that a write in progress under c.mu fails and lets go of it.
func (c *proxyConn) close() {
	c.client.Close()
	c.server.Close()
	c.mu.Lock()
	c.closed = true
	c.resumed.Broadcast()
	c.mu.Unlock()
}

// close stops accepting, closes every connection and waits for the
// proxy's goroutines.
func (p *Proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
	p.wg.Wait()
}
