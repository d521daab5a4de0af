package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// ProxyHeader names the header that trusted proxies append the address of
// their peer to.
type ProxyHeader uint8

const (
	// XForwardedFor is the de facto standard list of addresses, the client
	// first and each proxy's peer appended after it:
	//
	//	X-Forwarded-For: 203.0.113.7, 10.0.0.1, 10.0.0.2
	XForwardedFor ProxyHeader = iota + 1
	// Forwarded is RFC 7239's header, one element per hop whose for
	// parameter is the address the proxy received the request from:
	//
	//	Forwarded: for=203.0.113.7, for="[2001:db8:cafe::17]:4711"
	Forwarded
)

// String returns the header's name, "X-Forwarded-For" or "Forwarded"; any
// other value reads as "ProxyHeader(7)".
func (h ProxyHeader) String() string {
	switch h {
	case XForwardedFor:
		return "X-Forwarded-For"
	case Forwarded:
		return "Forwarded"
	}
	return "ProxyHeader(" + strconv.Itoa(int(h)) + ")"
}

// Bounds on the work one request can cost. A header is read right to left
// and only as far as the first hop that is not a trusted proxy, so a long
// header costs no more than a short one until its hops are all trusted.
const (
	// maxHops is the most hops read from a proxy header; a longer chain of
	// trusted proxies is not one a deployment builds, and the client falls
	// back to the peer.
	maxHops = 32
	// maxEntryLen is the longest X-Forwarded-For entry or Forwarded element
	// read; a longer one does not parse.
	maxEntryLen = 512
	// maxObfLen is the longest RFC 7239 obfuscated identifier taken as a
	// client's key.
	maxObfLen = 64
	// maxUnparsedLen is how much of a RemoteAddr that is not an address is
	// kept as the key.
	maxUnparsedLen = 64
)

// unknownPeer is the key of a request with no RemoteAddr at all.
const unknownPeer = "unknown"

// ipResolver finds a request's client address: the direct peer, or, when
// the peer is a trusted proxy, the first hop in the proxies' header that is
// not one. It is built by newIPResolver, never changes, and is safe for
// concurrent use.
type ipResolver struct {
	// header is the header the trusted proxies write; 0 trusts nobody.
	header ProxyHeader
	// trusted holds the proxies' prefixes, masked, with the IPv4-mapped
	// ones folded to IPv4 as addresses are.
	trusted []netip.Prefix
	// v6Bits is the prefix length IPv6 clients are keyed by.
	v6Bits int
}

// newIPResolver returns a resolver that trusts the proxies in cidrs to
// write header, and keys IPv6 clients by their /v6Bits prefix. A header of 0
// with no cidrs trusts nobody: the client is always the request's
// RemoteAddr. Each of cidrs is a CIDR prefix ("10.0.0.0/8",
// "2001:db8::/32") or a single address; a zone on a single address is
// dropped, as it is from every address matched. The errors name the
// option, the value and what is wrong with it.
func newIPResolver(header ProxyHeader, cidrs []string, v6Bits int) (*ipResolver, error) {
	r := &ipResolver{v6Bits: v6Bits}
	if header != 0 || len(cidrs) > 0 {
		if header != XForwardedFor && header != Forwarded {
			return nil, fmt.Errorf("httplimit: WithTrustedProxies: header must be XForwardedFor or Forwarded, got %v", header)
		}
		if len(cidrs) == 0 {
			return nil, errors.New("httplimit: WithTrustedProxies: no CIDR prefixes")
		}
		r.header = header
		r.trusted = make([]netip.Prefix, 0, len(cidrs))
		for _, s := range cidrs {
			p, err := parseTrustedPrefix(s)
			if err != nil {
				return nil, fmt.Errorf("httplimit: WithTrustedProxies: %q is not a CIDR prefix: %w", s, err)
			}
			r.trusted = append(r.trusted, p)
		}
	}
	if v6Bits < 1 || v6Bits > 128 {
		return nil, fmt.Errorf("httplimit: WithIPv6Prefix: bits must be 1 to 128, got %d", v6Bits)
	}
	return r, nil
}

// parseTrustedPrefix parses a CIDR prefix or a single address, masked, and
// an IPv4-mapped one (::ffff:10.0.0.0/104) folded to IPv4 (10.0.0.0/8), so
// that it matches the folded addresses it names.
func parseTrustedPrefix(s string) (netip.Prefix, error) {
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return netip.Prefix{}, err
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		a = a.WithZone("")
		p = netip.PrefixFrom(a, a.BitLen())
	}
	p = p.Masked()
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p, nil
}

// clientKey returns the client's identity as one key segment, never "":
//
//   - an IPv4 client's exact address, "203.0.113.7";
//   - an IPv6 client's /v6Bits prefix, "2001:db8:1:2::/64" (with 128, the
//     address itself, "2001:db8::1");
//   - the RFC 7239 obfuscated identifier a trusted proxy wrote for its
//     client, as written, "_hidden".
//
// The client is the peer, RemoteAddr, unless the peer is a trusted proxy.
// Then the configured header, and only that one, is read right to left
// across all its field lines, and the first hop that is not a trusted
// proxy is the client; if all are, the leftmost is. A hop that does not
// parse (garbage, an empty entry, Forwarded's "unknown" or an element
// without for), or a chain longer than maxHops, makes the peer the client
// after all: past a hop that cannot be read, nothing tells which hops the
// proxies wrote and which the client did. IPv4-mapped addresses are folded
// to IPv4 and zones dropped, both to match the trusted prefixes and in the
// key.
//
// A RemoteAddr that is not an address is kept, with bytes other than
// printable ASCII replaced by '_' and at most maxUnparsedLen of them, or
// is "unknown" when it is empty.
func (r *ipResolver) clientKey(req *http.Request) string {
	if req == nil {
		return unknownPeer
	}
	peer, ok := parseHostPort(req.RemoteAddr)
	if !ok {
		return unparsedPeerKey(req.RemoteAddr)
	}
	if r.header == 0 || !r.trusts(peer) {
		return r.peerKey(req.RemoteAddr, peer)
	}
	c, ok := r.headerClient(req.Header)
	switch {
	case !ok:
		return r.peerKey(req.RemoteAddr, peer)
	case c.obf != "":
		// A copy: the key may outlive the request, and a substring would
		// keep the whole header alive with it.
		return strings.Clone(c.obf)
	}
	return r.addrKey(c.addr)
}

// hop is one address a proxy header names: an IP address, or the
// obfuscated identifier a proxy gave its client in its place.
type hop struct {
	addr netip.Addr
	obf  string
}

// trusts reports whether a, folded, is one of the trusted proxies.
func (r *ipResolver) trusts(a netip.Addr) bool {
	for _, p := range r.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// headerClient walks the configured header right to left, the last field
// line first, and returns the first hop that is not a trusted proxy, or
// the leftmost if all are. It reports false when the header is absent or a
// hop it reaches does not parse.
func (r *ipResolver) headerClient(h http.Header) (hop, bool) {
	lines := h.Values(r.header.String())
	var client hop
	hops := 0
	for i := len(lines) - 1; i >= 0; i-- {
		for line, more := lines[i], true; more; {
			if hops++; hops > maxHops {
				return hop{}, false
			}
			var entry string
			var ok bool
			line, entry, more, ok = r.lastEntry(line)
			if !ok {
				return hop{}, false
			}
			if client, ok = r.parseEntry(entry); !ok {
				return hop{}, false
			}
			if client.obf != "" || !r.trusts(client.addr) {
				return client, true
			}
		}
	}
	return client, hops > 0
}

// lastEntry splits a field line of the configured header into what comes
// before its last entry and that entry; more reports whether there was a
// comma between them, ok whether the entry could be found.
func (r *ipResolver) lastEntry(line string) (before, entry string, more, ok bool) {
	if r.header == Forwarded {
		return lastForwardedElement(line)
	}
	return lastListEntry(line)
}

// parseEntry returns the hop an entry of the configured header names.
func (r *ipResolver) parseEntry(entry string) (hop, bool) {
	if r.header == Forwarded {
		return parseForwardedElement(entry)
	}
	a, ok := parseHostPort(trimOWS(entry))
	return hop{addr: a}, ok
}

// lastListEntry splits the last entry off an X-Forwarded-For field line,
// looking no further back than maxEntryLen.
func lastListEntry(line string) (before, entry string, more, ok bool) {
	lo := max(0, len(line)-maxEntryLen-1)
	i := strings.LastIndexByte(line[lo:], ',')
	if i < 0 {
		return "", line, false, lo == 0
	}
	i += lo
	return line[:i], line[i+1:], true, true
}

// lastForwardedElement splits the last element off a Forwarded field line,
// looking no further back than maxEntryLen. Commas inside quoted strings do
// not separate elements. Reading right to left, a quote closes a quoted
// string and the first quote before it that is not escaped opens it: on a
// well-formed line that is the string a left-to-right reader sees, and a
// malformed element further left cannot change how the elements the
// proxies appended to its right are read.
func lastForwardedElement(line string) (before, elem string, more, ok bool) {
	lo := max(0, len(line)-maxEntryLen-1)
	for i := len(line) - 1; i >= lo; i-- {
		switch line[i] {
		case ',':
			return line[:i], line[i+1:], true, true
		case '"':
			if i = openingQuote(line, lo, i); i < 0 {
				return "", "", false, false
			}
		}
	}
	return "", line, false, lo == 0
}

// openingQuote returns the index of the quote that opens the quoted string
// closed by s[end], looking no further back than lo, or -1 if there is none.
// A quote is escaped when an odd run of backslashes comes before it.
func openingQuote(s string, lo, end int) int {
	for i := end - 1; i >= lo; i-- {
		if s[i] != '"' {
			continue
		}
		n := 0
		for j := i - 1; j >= lo && s[j] == '\\'; j-- {
			n++
		}
		if n%2 == 0 {
			return i
		}
		i -= n
	}
	return -1
}

// parseForwardedElement returns the hop an RFC 7239 forwarded-element's for
// parameter names. Its pairs are separated by semicolons outside quoted
// strings, and every pair must parse, for or not; an element without for,
// or with two, does not.
func parseForwardedElement(elem string) (hop, bool) {
	var node string
	var found, escaped bool
	for rest, more := trimOWS(elem), true; more; {
		var pair string
		pair, rest, more = cutUnquoted(rest, ';')
		name, value, quoted, ok := parseForwardedPair(trimOWS(pair))
		if !ok {
			return hop{}, false
		}
		if !strings.EqualFold(name, "for") {
			continue
		}
		if found {
			return hop{}, false
		}
		node, escaped, found = value, quoted && strings.Contains(value, `\`), true
	}
	if !found {
		return hop{}, false
	}
	if escaped {
		node = unescapeQuoted(node)
	}
	return parseForwardedNode(node)
}

// cutUnquoted slices s around the first sep outside a quoted string. An
// unterminated quoted string runs to the end of s.
func cutUnquoted(s string, sep byte) (before, after string, found bool) {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case sep:
			return s[:i], s[i+1:], true
		case '"':
			for i++; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' {
					i++
				}
			}
		}
	}
	return s, "", false
}

// parseForwardedPair parses token "=" value, where value is a token or a
// quoted string; a quoted value comes back still escaped, without its
// quotes. An empty pair is allowed (the grammar's [ forwarded-pair ]) and
// comes back with an empty name.
func parseForwardedPair(pair string) (name, value string, quoted, ok bool) {
	if pair == "" {
		return "", "", false, true
	}
	name, value, ok = strings.Cut(pair, "=")
	if !ok || !isToken(name) {
		return "", "", false, false
	}
	if strings.HasPrefix(value, `"`) {
		value, ok = quotedContent(value)
		return name, value, true, ok
	}
	return name, value, false, isValueToken(value)
}

// quotedContent returns what is inside s, which must be exactly one
// quoted string, still escaped.
func quotedContent(s string) (string, bool) {
	if len(s) < 2 || s[0] != '"' {
		return "", false
	}
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"':
			return s[1:i], i == len(s)-1
		case c == '\\':
			if i++; i == len(s) || !isQuotedText(s[i]) {
				return "", false
			}
		case !isQuotedText(c):
			return "", false
		}
	}
	return "", false
}

// unescapeQuoted resolves the quoted pairs of a quoted string's content.
func unescapeQuoted(s string) string {
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b = append(b, s[i])
	}
	return string(b)
}

// parseForwardedNode parses an RFC 7239 node: an IPv4 address, a bracketed
// IPv6 address or an obfuscated identifier, each with an optional port
// (obfuscated or not). "unknown" is a hop that cannot be told, and does not
// parse, like any other name that is not an address. As X-Forwarded-For
// is, it accepts a bare IPv6 address too, which some proxies write.
func parseForwardedNode(node string) (hop, bool) {
	if strings.HasPrefix(node, "_") {
		id, port, hasPort := strings.Cut(node, ":")
		if !isObfuscated(id) || hasPort && !isPort(port) && !isObfuscated(port) {
			return hop{}, false
		}
		return hop{obf: id}, true
	}
	a, ok := parseHostPort(node)
	return hop{addr: a}, ok
}

// parseHostPort parses an address alone or with a port: "203.0.113.7",
// "203.0.113.7:80", "2001:db8::1", "[2001:db8::1]" and "[2001:db8::1]:80".
// The address comes back folded: an IPv4-mapped one as IPv4, without a
// zone.
func parseHostPort(s string) (netip.Addr, bool) {
	if strings.HasPrefix(s, "[") {
		host, rest, ok := strings.Cut(s[1:], "]")
		if !ok || rest != "" && (rest[0] != ':' || !isPort(rest[1:])) {
			return netip.Addr{}, false
		}
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() {
			return netip.Addr{}, false
		}
		return fold(a), true
	}
	if isIPv4Text(s) {
		host, port, hasPort := strings.Cut(s, ":")
		if hasPort && !isPort(port) {
			return netip.Addr{}, false
		}
		a, err := netip.ParseAddr(host)
		return a, err == nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return fold(a), true
}

// isIPv4Text reports whether s, if it is an address with or without a
// port, is IPv4: IPv6 text always has a colon before its first dot. Telling
// them apart first spares a failed parse, whose error allocates.
func isIPv4Text(s string) bool {
	i := strings.IndexAny(s, ".:")
	return i >= 0 && s[i] == '.'
}

// fold returns a as it is matched and keyed: IPv4-mapped IPv6 as IPv4,
// without a zone.
func fold(a netip.Addr) netip.Addr {
	return a.Unmap().WithZone("")
}

// peerKey returns the key of the request's peer a, parsed from remoteAddr.
// An IPv4 peer written as IPv4 has its key cut from remoteAddr, which
// allocates nothing: netip parses only canonical IPv4 text.
func (r *ipResolver) peerKey(remoteAddr string, a netip.Addr) string {
	if a.Is4() && isIPv4Text(remoteAddr) {
		host, _, _ := strings.Cut(remoteAddr, ":")
		return host
	}
	return r.addrKey(a)
}

// addrKey returns the key of a folded address: an IPv4 address exactly, an
// IPv6 one by its /v6Bits prefix.
func (r *ipResolver) addrKey(a netip.Addr) string {
	var buf [len("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128")]byte
	if a.Is4() || r.v6Bits >= 128 {
		return string(a.AppendTo(buf[:0]))
	}
	return string(netip.PrefixFrom(a, r.v6Bits).Masked().AppendTo(buf[:0]))
}

// unparsedPeerKey returns the key of a peer whose RemoteAddr is not an
// address (a Unix socket's, one a test wrote): its first maxUnparsedLen
// bytes, each that is not printable ASCII or is a space replaced by '_', or
// "unknown" for none. An address is never longer than maxUnparsedLen without
// a zone, and a zone can hold anything, so the result never parses as one.
func unparsedPeerKey(s string) string {
	if s == "" {
		return unknownPeer
	}
	b := []byte(s[:min(len(s), maxUnparsedLen)])
	for i, c := range b {
		if c <= ' ' || c > '~' {
			b[i] = '_'
		}
	}
	return string(b)
}

// trimOWS trims the optional whitespace, spaces and tabs, that HTTP allows
// around list entries and parameters.
func trimOWS(s string) string {
	return strings.Trim(s, " \t")
}

// isPort reports whether s is an RFC 7239 port: one to five digits.
func isPort(s string) bool {
	if len(s) == 0 || len(s) > 5 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// isObfuscated reports whether s is an RFC 7239 obfnode or obfport, "_"
// followed by ALPHA, DIGIT, ".", "_" or "-", at most maxObfLen bytes.
func isObfuscated(s string) bool {
	if len(s) < 2 || len(s) > maxObfLen || s[0] != '_' {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// isToken reports whether s is an RFC 9110 token.
func isToken(s string) bool { return nonEmptyOf(s, isTokenChar) }

// isValueToken reports whether s is an unquoted Forwarded value: a token,
// or, leniently, one with the colons and brackets of an address and port
// that RFC 7239 says to quote but some proxies do not.
func isValueToken(s string) bool {
	return nonEmptyOf(s, func(c byte) bool { return isTokenChar(c) || c == ':' || c == '[' || c == ']' })
}

// nonEmptyOf reports whether s has bytes and all of them are ok.
func nonEmptyOf(s string, ok func(byte) bool) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !ok(s[i]) {
			return false
		}
	}
	return true
}

func isTokenChar(c byte) bool {
	if isAlnum(c) {
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

func isAlnum(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// isQuotedText reports whether c may stand in a quoted string, as qdtext
// or escaped: tab, space, visible ASCII or obs-text, not a control byte.
func isQuotedText(c byte) bool {
	return c == '\t' || c >= ' ' && c != 0x7f
}
