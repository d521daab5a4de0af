package httplimit

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// fuzzProxies are the trusted proxies of the fuzz targets: IPv4 and IPv6
// ranges, one given IPv4-mapped, so that chains of trusted hops are easy to
// find.
var fuzzProxies = []string{"10.0.0.0/8", "2001:db8::/32", "::ffff:192.168.0.0/112", "127.0.0.1"}

// fuzzPeers are RemoteAddrs, trusted or not, the fuzzer picks from besides
// its own.
var fuzzPeers = []string{"10.0.0.1:80", "[2001:db8::1]:443", "[::ffff:192.168.1.1]:80", "203.0.113.7:5678", "[2001:db9::1]:1"}

func FuzzXForwardedFor(f *testing.F) {
	for _, s := range []string{
		"203.0.113.7",
		"198.51.100.9, 203.0.113.7, 10.0.0.2",
		" 203.0.113.7 ,\t10.0.0.2 ",
		"203.0.113.7:5678, [2001:db9:cafe::17]:4711, [2001:db8::5]",
		"10.0.0.3, 10.0.0.2",
		"::ffff:203.0.113.7, ::ffff:10.0.0.2, ::ffff:192.168.3.4",
		"fe80::1%eth0, 2001:db8::9%lo",
		"garbage, 203.0.113.7",
		"203.0.113.7, garbage",
		"203.0.113.7, , 10.0.0.2",
		"203.0.113.7,",
		"unknown",
		"_hidden",
		"[203.0.113.7]",
		"203.0.113.7:123456",
		"[2001:db8::1",
		"\x00\xff",
	} {
		f.Add(s, "", uint8(64), uint8(0), "")
	}
	f.Add("198.51.100.9, 203.0.113.7", "10.0.0.3, 10.0.0.2", uint8(48), uint8(0), "")
	f.Add("10.0.0.3", "10.0.0.2", uint8(128), uint8(1), "")
	f.Add("203.0.113.7", "", uint8(64), uint8(3), "")
	f.Add("203.0.113.7", "", uint8(64), uint8(255), "[fe80::1%eth0]:80")
	f.Add("203.0.113.7", "", uint8(64), uint8(255), "garbage")
	f.Add("203.0.113.7", "", uint8(64), uint8(255), "")
	f.Fuzz(func(t *testing.T, line1, line2 string, bits, peer uint8, remote string) {
		checkClientKey(t, XForwardedFor, line1, line2, bits, peer, remote)
	})
}

func FuzzForwarded(f *testing.F) {
	for _, s := range []string{
		"for=203.0.113.7",
		`for=198.51.100.9, for="[2001:db9:cafe::17]:4711", for=10.0.0.2`,
		"proto=https;for=203.0.113.7;by=10.0.0.1;host=example.com",
		`For=203.0.113.7, FOR="10.0.0.2:80"`,
		`for="[::ffff:203.0.113.7]:1", for="[fe80::1%25eth0]"`,
		"for=[2001:db9:cafe::17]:4711",
		`for="2001:db9:cafe::17"`,
		" for=203.0.113.7 ; proto=https ,\tfor=10.0.0.2 ",
		"for=203.0.113.7;;proto=http;",
		`for=203.0.113.7;ext="a, for=198.51.100.9; b", for=10.0.0.2;ext=";,"`,
		`for=203.0.113.7;ext="say \"hi, for=198.51.100.9\" \\", for=10.0.0.2`,
		`for="\[2001:db9:cafe::17\]:47\11"`,
		"for=unknown, for=10.0.0.2",
		`for="unknown:4711"`,
		"for=203.0.113.7, proto=https",
		"for=203.0.113.7, , for=10.0.0.2",
		"for=203.0.113.7;for=198.51.100.9",
		`for="203.0.113.7`,
		`for="203.0.113.7"x`,
		`for=203.0.113.7;ext="a\"`,
		`for="198.51.100.9, for=203.0.113.7, for=10.0.0.2`,
		"for=_hidden, for=10.0.0.2",
		`for="_hidden:_port"`,
		`for="_hid\den:4711"`,
		`for="_hid$den"`,
		"for=_",
		`""""\"\\"`,
	} {
		f.Add(s, "", uint8(64), uint8(0), "")
	}
	f.Add("for=198.51.100.9", "for=203.0.113.7, for=10.0.0.2", uint8(48), uint8(0), "")
	f.Add(`for="198.51.100.9`, "for=203.0.113.7", uint8(128), uint8(1), "")
	f.Add("for=_hidden", "", uint8(64), uint8(3), "")
	f.Add("for=203.0.113.7", "", uint8(64), uint8(255), "@")
	f.Fuzz(func(t *testing.T, line1, line2 string, bits, peer uint8, remote string) {
		checkClientKey(t, Forwarded, line1, line2, bits, peer, remote)
	})
}

// checkClientKey resolves a request with the header lines line1 and line2
// (line2 only when not empty) from a peer chosen by peer (remote itself
// when peer is past fuzzPeers), keying IPv6 by bits (folded to 1..128), and
// checks the key against a model that knows only which addresses the
// request holds, not how the header is walked: the key is never empty,
// the peer's when the peer is not trusted, and otherwise the peer's or that
// of an address or obfuscated identifier written in the header.
func checkClientKey(t *testing.T, header ProxyHeader, line1, line2 string, bits, peer uint8, remote string) {
	v6Bits := int(bits)%128 + 1
	r, err := newIPResolver(header, fuzzProxies, v6Bits)
	if err != nil {
		t.Fatal(err)
	}
	if int(peer) < len(fuzzPeers) {
		remote = fuzzPeers[peer]
	}
	lines := []string{line1}
	if line2 != "" {
		lines = append(lines, line2)
	}
	req := &http.Request{RemoteAddr: remote, Header: http.Header{header.String(): lines}}
	got := r.clientKey(req)

	if got == "" {
		t.Fatalf("clientKey = \"\"")
	}
	if len(got) > maxEntryLen {
		t.Fatalf("clientKey = %q: %d bytes, longer than any address", got, len(got))
	}
	peerAddr, ok := parseHostPort(remote)
	if want, strict := strictAddr(remote); strict && (!ok || peerAddr != want) {
		t.Fatalf("RemoteAddr %q: parsed as %v (ok %v), want %v", remote, peerAddr, ok, want)
	}
	if !ok {
		if got != unparsedPeerKey(remote) {
			t.Fatalf("RemoteAddr %q does not parse: clientKey = %q, want %q", remote, got, unparsedPeerKey(remote))
		}
		if _, err := netip.ParseAddr(got); err == nil {
			t.Fatalf("RemoteAddr %q does not parse, but its key %q does", remote, got)
		}
		return
	}
	peerKey := modelKey(peerAddr, v6Bits)
	if got == peerKey {
		return
	}
	if !modelTrusts(peerAddr) {
		t.Fatalf("untrusted peer %q: clientKey = %q, want the peer's %q", remote, got, peerKey)
	}
	if strings.HasPrefix(got, "_") {
		if header != Forwarded || !isObfuscated(got) || !strings.Contains(strings.ReplaceAll(strings.Join(lines, ","), `\`, ""), got) {
			t.Fatalf("clientKey = %q, not an obfuscated identifier in %s: %q", got, header, lines)
		}
		return
	}
	for _, line := range lines {
		for _, a := range modelHeaderAddrs(line) {
			if got == modelKey(a, v6Bits) {
				return
			}
		}
	}
	t.Fatalf("clientKey = %q: neither the peer's %q nor the key of an address in %s: %q", got, peerKey, header, lines)
}

// strictAddr parses remoteAddr as netip does, an address alone or with a
// port of at most five digits, folded, and reports whether it could.
func strictAddr(remoteAddr string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(remoteAddr); err == nil {
		return a.Unmap().WithZone(""), true
	}
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil || len(remoteAddr)-strings.LastIndexByte(remoteAddr, ':')-1 > 5 {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap().WithZone(""), true
}

func modelTrusts(a netip.Addr) bool {
	for _, s := range fuzzProxies {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			p = netip.PrefixFrom(netip.MustParseAddr(s), 32)
		}
		if p.Contains(a) || p.Contains(netip.AddrFrom16(a.As16())) {
			return true
		}
	}
	return false
}

// modelHeaderAddrs returns every address written in line: each run of text
// between separators, with a port cut off, after removing backslashes.
func modelHeaderAddrs(line string) []netip.Addr {
	var addrs []netip.Addr
	line = strings.ReplaceAll(line, `\`, "")
	for _, field := range strings.FieldsFunc(line, func(c rune) bool { return strings.ContainsRune(",;=\"[] \t", c) }) {
		if a, err := netip.ParseAddr(field); err == nil {
			addrs = append(addrs, a.Unmap().WithZone(""))
		} else if host, _, ok := strings.Cut(field, ":"); ok {
			if a, err := netip.ParseAddr(host); err == nil {
				addrs = append(addrs, a.Unmap().WithZone(""))
			}
		}
	}
	return addrs
}

func modelKey(a netip.Addr, v6Bits int) string {
	switch {
	case a.Is4():
		return a.String()
	case v6Bits == 128:
		return a.String()
	}
	p, _ := a.Prefix(v6Bits)
	return p.String()
}
