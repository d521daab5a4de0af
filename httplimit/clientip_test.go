package httplimit

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// proxies are the trusted proxies of most cases: a private IPv4 range and
// one IPv6 /48.
var proxies = []string{"10.0.0.0/8", "2001:db8:ffff::/48"}

// ipRequest returns a request from remoteAddr carrying header, whose keys
// are set as a server would, canonicalized, with each field line in order.
func ipRequest(remoteAddr string, header map[string][]string) *http.Request {
	h := http.Header{}
	for name, lines := range header {
		for _, line := range lines {
			h.Add(name, line)
		}
	}
	return &http.Request{RemoteAddr: remoteAddr, Header: h}
}

func mustResolver(t testing.TB, header ProxyHeader, cidrs []string, v6Bits int) *ipResolver {
	t.Helper()
	r, err := newIPResolver(header, cidrs, v6Bits)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestProxyHeaderString(t *testing.T) {
	for h, want := range map[ProxyHeader]string{
		XForwardedFor: "X-Forwarded-For",
		Forwarded:     "Forwarded",
		0:             "ProxyHeader(0)",
		7:             "ProxyHeader(7)",
		255:           "ProxyHeader(255)",
	} {
		if got := h.String(); got != want {
			t.Errorf("ProxyHeader(%d).String() = %q, want %q", uint8(h), got, want)
		}
	}
}

func TestNewIPResolverErrors(t *testing.T) {
	// netipError is netip's own reason, which the message ends with.
	netipError := func(s string) string {
		if strings.Contains(s, "/") {
			_, err := netip.ParsePrefix(s)
			return err.Error()
		}
		_, err := netip.ParseAddr(s)
		return err.Error()
	}
	tests := []struct {
		name   string
		header ProxyHeader
		cidrs  []string
		v6Bits int
		want   string
	}{
		{"prefix too long", XForwardedFor, []string{"10.0.0.0/33"}, 64,
			`httplimit: WithTrustedProxies: "10.0.0.0/33" is not a CIDR prefix: ` + netipError("10.0.0.0/33")},
		{"IPv6 prefix too long", Forwarded, []string{"10.0.0.0/8", "2001:db8::/129"}, 64,
			`httplimit: WithTrustedProxies: "2001:db8::/129" is not a CIDR prefix: ` + netipError("2001:db8::/129")},
		{"not an address", XForwardedFor, []string{"proxy.internal"}, 64,
			`httplimit: WithTrustedProxies: "proxy.internal" is not a CIDR prefix: ` + netipError("proxy.internal")},
		{"empty", XForwardedFor, []string{""}, 64,
			`httplimit: WithTrustedProxies: "" is not a CIDR prefix: ` + netipError("")},
		{"spaces", XForwardedFor, []string{" 10.0.0.0/8"}, 64,
			`httplimit: WithTrustedProxies: " 10.0.0.0/8" is not a CIDR prefix: ` + netipError(" 10.0.0.0/8")},
		{"zone in a prefix", XForwardedFor, []string{"fe80::%eth0/64"}, 64,
			`httplimit: WithTrustedProxies: "fe80::%eth0/64" is not a CIDR prefix: ` + netipError("fe80::%eth0/64")},
		{"unknown header", 7, []string{"10.0.0.0/8"}, 64,
			"httplimit: WithTrustedProxies: header must be XForwardedFor or Forwarded, got ProxyHeader(7)"},
		{"unknown header without prefixes", 7, nil, 64,
			"httplimit: WithTrustedProxies: header must be XForwardedFor or Forwarded, got ProxyHeader(7)"},
		{"prefixes without a header", 0, []string{"10.0.0.0/8"}, 64,
			"httplimit: WithTrustedProxies: header must be XForwardedFor or Forwarded, got ProxyHeader(0)"},
		{"header without prefixes", XForwardedFor, nil, 64,
			"httplimit: WithTrustedProxies: no CIDR prefixes"},
		{"header with an empty list", Forwarded, []string{}, 64,
			"httplimit: WithTrustedProxies: no CIDR prefixes"},
		{"IPv6 bits 0", 0, nil, 0, "httplimit: WithIPv6Prefix: bits must be 1 to 128, got 0"},
		{"IPv6 bits 129", 0, nil, 129, "httplimit: WithIPv6Prefix: bits must be 1 to 128, got 129"},
		{"IPv6 bits negative", XForwardedFor, proxies, -1, "httplimit: WithIPv6Prefix: bits must be 1 to 128, got -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := newIPResolver(tt.header, tt.cidrs, tt.v6Bits)
			if err == nil {
				t.Fatalf("newIPResolver(%v, %q, %d) = %+v, want error %q", tt.header, tt.cidrs, tt.v6Bits, r, tt.want)
			}
			if r != nil {
				t.Errorf("newIPResolver returned a resolver with its error")
			}
			if err.Error() != tt.want {
				t.Errorf("error = %q\nwant    %q", err, tt.want)
			}
		})
	}
}

// TestNewIPResolverTrusted checks which peers each form of trusted prefix
// names, by whether a peer's X-Forwarded-For is read.
func TestNewIPResolverTrusted(t *testing.T) {
	tests := []struct {
		cidr      string
		trusted   []string
		untrusted []string
	}{
		{"10.0.0.0/8", []string{"10.0.0.1", "10.255.255.255", "[::ffff:10.1.2.3]:80"}, []string{"11.0.0.1", "[::a00:1]:80"}},
		{"10.1.2.3/8", []string{"10.9.9.9"}, []string{"11.0.0.1"}}, // an unmasked prefix is masked
		{"10.0.0.1", []string{"10.0.0.1:443"}, []string{"10.0.0.2"}},
		{"::ffff:10.0.0.0/104", []string{"10.1.2.3", "[::ffff:10.1.2.3]:80"}, []string{"11.0.0.1"}},
		{"::ffff:10.0.0.1", []string{"10.0.0.1"}, []string{"10.0.0.2"}},
		{"2001:db8::/32", []string{"[2001:db8:1::1]:80", "2001:db8::1", "[2001:db8::1%eth0]:80"}, []string{"[2001:db9::1]:80", "10.0.0.1"}},
		{"fe80::1%eth0", []string{"[fe80::1%eth1]:80", "[fe80::1]:80"}, []string{"[fe80::2]:80"}},
		{"0.0.0.0/0", []string{"203.0.113.7", "[::ffff:203.0.113.7]:1"}, []string{"[2001:db8::1]:80"}},
	}
	for _, tt := range tests {
		t.Run(tt.cidr, func(t *testing.T) {
			r := mustResolver(t, XForwardedFor, []string{tt.cidr}, 64)
			header := map[string][]string{"X-Forwarded-For": {"198.51.100.9"}}
			for _, peer := range tt.trusted {
				if got := r.clientKey(ipRequest(peer, header)); got != "198.51.100.9" {
					t.Errorf("peer %s: clientKey = %q, want the header's 198.51.100.9 (trusted)", peer, got)
				}
			}
			for _, peer := range tt.untrusted {
				if got := r.clientKey(ipRequest(peer, header)); got == "198.51.100.9" {
					t.Errorf("peer %s: clientKey = %q, the header's: want the peer (not trusted)", peer, got)
				}
			}
		})
	}
}

func TestClientKey(t *testing.T) {
	type header = map[string][]string
	xff := func(lines ...string) header { return header{"X-Forwarded-For": lines} }
	fwd := func(lines ...string) header { return header{"Forwarded": lines} }
	tests := []struct {
		name    string
		header  ProxyHeader // 0 trusts nobody
		trusted []string    // proxies when nil and header is set
		remote  string
		h       header
		want    string
	}{
		// The peer, when it is not a trusted proxy.
		{"IPv4 peer", 0, nil, "203.0.113.7:5678", nil, "203.0.113.7"},
		{"bare IPv4 peer", 0, nil, "203.0.113.7", nil, "203.0.113.7"},
		{"IPv6 peer", 0, nil, "[2001:db8:cafe::17]:4711", nil, "2001:db8:cafe::/64"},
		{"bare IPv6 peer", 0, nil, "2001:db8:cafe::17", nil, "2001:db8:cafe::/64"},
		{"bracketed IPv6 peer without a port", 0, nil, "[2001:db8:cafe::17]", nil, "2001:db8:cafe::/64"},
		{"IPv4-mapped peer", 0, nil, "[::ffff:203.0.113.7]:5678", nil, "203.0.113.7"},
		{"bare IPv4-mapped peer", 0, nil, "::ffff:203.0.113.7", nil, "203.0.113.7"},
		{"zoned peer", 0, nil, "[fe80::1%eth0]:5678", nil, "fe80::/64"},
		{"no proxies, spoofed X-Forwarded-For", 0, nil, "203.0.113.7:5678", xff("198.51.100.9"), "203.0.113.7"},
		{"no proxies, spoofed Forwarded", 0, nil, "203.0.113.7:5678", fwd("for=198.51.100.9"), "203.0.113.7"},
		{"untrusted peer, spoofed X-Forwarded-For", XForwardedFor, nil, "203.0.113.7:5678", xff("198.51.100.9, 10.0.0.2"), "203.0.113.7"},
		{"untrusted peer, spoofed Forwarded", Forwarded, nil, "203.0.113.7:5678", fwd("for=198.51.100.9, for=10.0.0.2"), "203.0.113.7"},
		{"untrusted IPv6 peer, spoofed Forwarded", Forwarded, nil, "[2001:db8:cafe::17]:1", fwd("for=198.51.100.9"), "2001:db8:cafe::/64"},

		// Only the configured header.
		{"trusted peer, no header", XForwardedFor, nil, "10.0.0.1:80", nil, "10.0.0.1"},
		{"X-Forwarded-For proxies, Forwarded ignored", XForwardedFor, nil, "10.0.0.1:80", fwd("for=198.51.100.9"), "10.0.0.1"},
		{"Forwarded proxies, X-Forwarded-For ignored", Forwarded, nil, "10.0.0.1:80", xff("198.51.100.9"), "10.0.0.1"},
		{"X-Forwarded-For proxies, both headers", XForwardedFor, nil, "10.0.0.1:80",
			header{"X-Forwarded-For": {"203.0.113.7"}, "Forwarded": {"for=198.51.100.9"}}, "203.0.113.7"},
		{"Forwarded proxies, both headers", Forwarded, nil, "10.0.0.1:80",
			header{"X-Forwarded-For": {"198.51.100.9"}, "Forwarded": {"for=203.0.113.7"}}, "203.0.113.7"},

		// X-Forwarded-For chains.
		{"XFF chain", XForwardedFor, nil, "10.0.0.1:80", xff("198.51.100.9, 203.0.113.7, 10.0.0.3, 10.0.0.2"), "203.0.113.7"},
		{"XFF chain through IPv6 proxies", XForwardedFor, nil, "[2001:db8:ffff::1]:443", xff("203.0.113.7, 2001:db8:ffff::2"), "203.0.113.7"},
		{"XFF all trusted: leftmost", XForwardedFor, nil, "10.0.0.1:80", xff("10.0.0.3, 10.0.0.2"), "10.0.0.3"},
		{"XFF one trusted hop", XForwardedFor, nil, "10.0.0.1:80", xff("10.0.0.9"), "10.0.0.9"},
		{"XFF IPv4 with port", XForwardedFor, nil, "10.0.0.1:80", xff("203.0.113.7:5678"), "203.0.113.7"},
		{"XFF IPv6 with port", XForwardedFor, nil, "10.0.0.1:80", xff("[2001:db8:cafe::17]:4711"), "2001:db8:cafe::/64"},
		{"XFF bracketed IPv6", XForwardedFor, nil, "10.0.0.1:80", xff("[2001:db8:cafe::17]"), "2001:db8:cafe::/64"},
		{"XFF bare IPv6", XForwardedFor, nil, "10.0.0.1:80", xff("2001:db8:cafe::17"), "2001:db8:cafe::/64"},
		{"XFF whitespace", XForwardedFor, nil, "10.0.0.1:80", xff(" 203.0.113.7 ,\t10.0.0.2 "), "203.0.113.7"},
		{"XFF no whitespace", XForwardedFor, nil, "10.0.0.1:80", xff("203.0.113.7,10.0.0.2"), "203.0.113.7"},
		{"XFF IPv4-mapped client", XForwardedFor, nil, "10.0.0.1:80", xff("::ffff:203.0.113.7"), "203.0.113.7"},
		{"XFF IPv4-mapped proxy skipped", XForwardedFor, nil, "10.0.0.1:80", xff("203.0.113.7, ::ffff:10.0.0.2"), "203.0.113.7"},
		{"XFF zone dropped", XForwardedFor, nil, "10.0.0.1:80", xff("fe80::1%eth0"), "fe80::/64"},
		{"XFF lines in order", XForwardedFor, nil, "10.0.0.1:80", xff("198.51.100.9, 203.0.113.7", "10.0.0.3, 10.0.0.2"), "203.0.113.7"},
		{"XFF client on the last line", XForwardedFor, nil, "10.0.0.1:80", xff("198.51.100.9", "203.0.113.7, 10.0.0.2"), "203.0.113.7"},
		{"XFF lines all trusted: leftmost", XForwardedFor, nil, "10.0.0.1:80", xff("10.0.0.4, 10.0.0.3", "10.0.0.2"), "10.0.0.4"},
		{"XFF garbage left of the client", XForwardedFor, nil, "10.0.0.1:80", xff("not an address, 203.0.113.7"), "203.0.113.7"},
		{"XFF garbage reached", XForwardedFor, nil, "10.0.0.1:80", xff("203.0.113.7, garbage, 10.0.0.2"), "10.0.0.1"},
		{"XFF unknown", XForwardedFor, nil, "10.0.0.1:80", xff("unknown"), "10.0.0.1"},
		{"XFF obfuscated is garbage", XForwardedFor, nil, "10.0.0.1:80", xff("_hidden"), "10.0.0.1"},
		{"XFF empty entry", XForwardedFor, nil, "10.0.0.1:80", xff("203.0.113.7, , 10.0.0.2"), "10.0.0.1"},
		{"XFF trailing comma", XForwardedFor, nil, "10.0.0.1:80", xff("203.0.113.7,"), "10.0.0.1"},
		{"XFF empty line", XForwardedFor, nil, "10.0.0.1:80", xff("203.0.113.7", ""), "10.0.0.1"},
		{"XFF bad port", XForwardedFor, nil, "10.0.0.1:80", xff("203.0.113.7:123456"), "10.0.0.1"},
		{"XFF empty port", XForwardedFor, nil, "10.0.0.1:80", xff("203.0.113.7:"), "10.0.0.1"},
		{"XFF bracketed IPv4", XForwardedFor, nil, "10.0.0.1:80", xff("[203.0.113.7]"), "10.0.0.1"},
		{"XFF leading zeros", XForwardedFor, nil, "10.0.0.1:80", xff("203.0.113.07"), "10.0.0.1"},
		{"XFF IPv6 peer keyed on fallback", XForwardedFor, nil, "[2001:db8:ffff::1]:443", xff("garbage"), "2001:db8:ffff::/64"},
		{"XFF IPv4-mapped trusted peer", XForwardedFor, nil, "[::ffff:10.0.0.1]:80", xff("203.0.113.7"), "203.0.113.7"},
		{"XFF IPv4-mapped trusted prefix", XForwardedFor, []string{"::ffff:10.0.0.0/104"}, "10.0.0.1:80", xff("203.0.113.7, 10.0.0.2"), "203.0.113.7"},
		{"XFF single trusted address", XForwardedFor, []string{"10.0.0.1"}, "10.0.0.1:80", xff("203.0.113.7, 10.0.0.2"), "10.0.0.2"},

		// Forwarded chains.
		{"Forwarded chain, quoted IPv6 with port", Forwarded, nil, "10.0.0.1:80",
			fwd(`for=198.51.100.9, for="[2001:db8:cafe::17]:4711", for=10.0.0.2`), "2001:db8:cafe::/64"},
		{"Forwarded chain", Forwarded, nil, "10.0.0.1:80", fwd("for=198.51.100.9, for=203.0.113.7, for=10.0.0.3, for=10.0.0.2"), "203.0.113.7"},
		{"Forwarded all trusted: leftmost", Forwarded, nil, "10.0.0.1:80", fwd(`for=10.0.0.3, for="[2001:db8:ffff::9]:1"`), "10.0.0.3"},
		{"Forwarded other parameters", Forwarded, nil, "10.0.0.1:80", fwd("proto=https;for=203.0.113.7;by=10.0.0.1;host=example.com"), "203.0.113.7"},
		{"Forwarded names are case-insensitive", Forwarded, nil, "10.0.0.1:80", fwd(`For=203.0.113.7, FOR="10.0.0.2:80"`), "203.0.113.7"},
		{"Forwarded quoted IPv4 with port", Forwarded, nil, "10.0.0.1:80", fwd(`for="203.0.113.7:4711"`), "203.0.113.7"},
		{"Forwarded quoted IPv6", Forwarded, nil, "10.0.0.1:80", fwd(`for="[2001:db8:cafe::17]"`), "2001:db8:cafe::/64"},
		{"Forwarded quoted IPv4-mapped", Forwarded, nil, "10.0.0.1:80", fwd(`for="[::ffff:203.0.113.7]:1"`), "203.0.113.7"},
		{"Forwarded zone dropped", Forwarded, nil, "10.0.0.1:80", fwd(`for="[fe80::1%25eth0]"`), "fe80::/64"},
		{"Forwarded unquoted IPv6 (lenient)", Forwarded, nil, "10.0.0.1:80", fwd("for=[2001:db8:cafe::17]:4711"), "2001:db8:cafe::/64"},
		{"Forwarded bare IPv6 (lenient)", Forwarded, nil, "10.0.0.1:80", fwd(`for="2001:db8:cafe::17"`), "2001:db8:cafe::/64"},
		{"Forwarded whitespace", Forwarded, nil, "10.0.0.1:80", fwd(" for=203.0.113.7 ; proto=https ,\tfor=10.0.0.2 "), "203.0.113.7"},
		{"Forwarded empty pairs", Forwarded, nil, "10.0.0.1:80", fwd("for=203.0.113.7;;proto=http;"), "203.0.113.7"},
		{"Forwarded quoted commas and semicolons", Forwarded, nil, "10.0.0.1:80",
			fwd(`for=203.0.113.7;ext="a, for=198.51.100.9; b", for=10.0.0.2;ext=";,"`), "203.0.113.7"},
		{"Forwarded escaped quotes", Forwarded, nil, "10.0.0.1:80",
			fwd(`for=203.0.113.7;ext="say \"hi, for=198.51.100.9\" \\", for=10.0.0.2`), "203.0.113.7"},
		{"Forwarded escapes in for", Forwarded, nil, "10.0.0.1:80", fwd(`for="\[2001:db8:cafe::17\]:47\11"`), "2001:db8:cafe::/64"},
		{"Forwarded lines in order", Forwarded, nil, "10.0.0.1:80", fwd("for=198.51.100.9, for=203.0.113.7", "for=10.0.0.2"), "203.0.113.7"},
		{"Forwarded lines all trusted: leftmost", Forwarded, nil, "10.0.0.1:80", fwd("for=10.0.0.3", "for=10.0.0.2"), "10.0.0.3"},
		{"Forwarded unknown", Forwarded, nil, "10.0.0.1:80", fwd("for=unknown"), "10.0.0.1"},
		{"Forwarded unknown behind a proxy", Forwarded, nil, "10.0.0.1:80", fwd("for=203.0.113.7, for=unknown, for=10.0.0.2"), "10.0.0.1"},
		{"Forwarded unknown with port", Forwarded, nil, "10.0.0.1:80", fwd(`for="unknown:4711"`), "10.0.0.1"},
		{"Forwarded unknown left of the client", Forwarded, nil, "10.0.0.1:80", fwd("for=unknown, for=203.0.113.7"), "203.0.113.7"},
		{"Forwarded garbage", Forwarded, nil, "10.0.0.1:80", fwd("for=garbage"), "10.0.0.1"},
		{"Forwarded not pairs", Forwarded, nil, "10.0.0.1:80", fwd("203.0.113.7"), "10.0.0.1"},
		{"Forwarded element without for", Forwarded, nil, "10.0.0.1:80", fwd("for=203.0.113.7, proto=https"), "10.0.0.1"},
		{"Forwarded empty element", Forwarded, nil, "10.0.0.1:80", fwd("for=203.0.113.7, , for=10.0.0.2"), "10.0.0.1"},
		{"Forwarded trailing comma", Forwarded, nil, "10.0.0.1:80", fwd("for=203.0.113.7,"), "10.0.0.1"},
		{"Forwarded empty for", Forwarded, nil, "10.0.0.1:80", fwd(`for=""`), "10.0.0.1"},
		{"Forwarded for twice", Forwarded, nil, "10.0.0.1:80", fwd("for=203.0.113.7;for=198.51.100.9"), "10.0.0.1"},
		{"Forwarded unquoted IPv6 in a token", Forwarded, nil, "10.0.0.1:80", fwd("for=2001:db8:cafe::17"), "2001:db8:cafe::/64"},
		{"Forwarded bracketed IPv4", Forwarded, nil, "10.0.0.1:80", fwd(`for="[203.0.113.7]"`), "10.0.0.1"},
		{"Forwarded unterminated quote", Forwarded, nil, "10.0.0.1:80", fwd(`for="203.0.113.7`), "10.0.0.1"},
		{"Forwarded text after a quote", Forwarded, nil, "10.0.0.1:80", fwd(`for="203.0.113.7"x`), "10.0.0.1"},
		{"Forwarded escaped closing quote", Forwarded, nil, "10.0.0.1:80", fwd(`for=203.0.113.7;ext="a\"`), "10.0.0.1"},
		{"Forwarded stray quote", Forwarded, nil, "10.0.0.1:80", fwd(`for=203.0.113.7;ext=a"b"`), "10.0.0.1"},
		{"Forwarded control byte in a quote", Forwarded, nil, "10.0.0.1:80", fwd("for=203.0.113.7;ext=\"a\x01\""), "10.0.0.1"},
		{"Forwarded bad name", Forwarded, nil, "10.0.0.1:80", fwd("for=203.0.113.7;e(x)t=1"), "10.0.0.1"},
		{"Forwarded space around =", Forwarded, nil, "10.0.0.1:80", fwd("for = 203.0.113.7"), "10.0.0.1"},
		// What a client writes cannot change how the elements its proxies
		// appended to the right are read: not even an unterminated quote.
		{"Forwarded unterminated quote left of the client", Forwarded, nil, "10.0.0.1:80",
			fwd(`for="198.51.100.9, for=203.0.113.7, for=10.0.0.2`), "203.0.113.7"},
		{"Forwarded unterminated quote on an earlier line", Forwarded, nil, "10.0.0.1:80",
			fwd(`for="198.51.100.9`, "for=203.0.113.7"), "203.0.113.7"},

		// Obfuscated identifiers.
		{"obfuscated client", Forwarded, nil, "10.0.0.1:80", fwd("for=_hidden, for=10.0.0.2"), "_hidden"},
		{"obfuscated client, every character", Forwarded, nil, "10.0.0.1:80", fwd("for=_Az09._-"), "_Az09._-"},
		{"obfuscated client with port", Forwarded, nil, "10.0.0.1:80", fwd(`for="_hidden:4711"`), "_hidden"},
		{"obfuscated client with obfuscated port", Forwarded, nil, "10.0.0.1:80", fwd(`for="_hidden:_port"`), "_hidden"},
		{"obfuscated client, escaped", Forwarded, nil, "10.0.0.1:80", fwd(`for="_hid\den"`), "_hidden"},
		{"obfuscated client left of the client", Forwarded, nil, "10.0.0.1:80", fwd("for=_hidden, for=203.0.113.7"), "203.0.113.7"},
		{"obfuscated, 64 bytes", Forwarded, nil, "10.0.0.1:80", fwd("for=_" + strings.Repeat("a", 63)), "_" + strings.Repeat("a", 63)},
		{"obfuscated, 65 bytes", Forwarded, nil, "10.0.0.1:80", fwd("for=_" + strings.Repeat("a", 64)), "10.0.0.1"},
		{"obfuscated, underscore alone", Forwarded, nil, "10.0.0.1:80", fwd("for=_"), "10.0.0.1"},
		{"obfuscated, bad character", Forwarded, nil, "10.0.0.1:80", fwd(`for="_hid$den"`), "10.0.0.1"},
		{"obfuscated, bad port", Forwarded, nil, "10.0.0.1:80", fwd(`for="_hidden:port"`), "10.0.0.1"},
		{"obfuscated, empty port", Forwarded, nil, "10.0.0.1:80", fwd(`for="_hidden:"`), "10.0.0.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			trusted := tt.trusted
			if trusted == nil && tt.header != 0 {
				trusted = proxies
			}
			r := mustResolver(t, tt.header, trusted, 64)
			if got := r.clientKey(ipRequest(tt.remote, tt.h)); got != tt.want {
				t.Errorf("clientKey(RemoteAddr %q, %q) = %q, want %q", tt.remote, tt.h, got, tt.want)
			}
		})
	}
}

func TestClientKeyIPv6Prefix(t *testing.T) {
	tests := []struct {
		bits int
		a, b string // two peers
		want string // a's key
		same bool   // whether b shares it
	}{
		{64, "[2001:db8:1:2::5]:1", "[2001:db8:1:2:ffff:ffff:ffff:ffff]:2", "2001:db8:1:2::/64", true},
		{64, "[2001:db8:1:2::5]:1", "[2001:db8:1:3::5]:1", "2001:db8:1:2::/64", false},
		{48, "[2001:db8:1:2::5]:1", "[2001:db8:1:ffff::9]:2", "2001:db8:1::/48", true},
		{48, "[2001:db8:1:2::5]:1", "[2001:db8:2:2::5]:1", "2001:db8:1::/48", false},
		{128, "[2001:db8::1]:1", "[2001:db8::1]:2", "2001:db8::1", true},
		{128, "[2001:db8::1]:1", "[2001:db8::2]:1", "2001:db8::1", false},
		{1, "[2001:db8::1]:1", "[7fff::1]:1", "::/1", true},
		{56, "[2001:db8:1:2ff::1]:1", "[2001:db8:1:200::1]:1", "2001:db8:1:200::/56", true},
		{48, "203.0.113.7:1", "203.0.113.8:1", "203.0.113.7", false}, // IPv4 is exact whatever the bits
		{128, "203.0.113.7:1", "[::ffff:203.0.113.7]:2", "203.0.113.7", true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("/%d %s %s", tt.bits, tt.a, tt.b), func(t *testing.T) {
			r := mustResolver(t, 0, nil, tt.bits)
			a, b := r.clientKey(ipRequest(tt.a, nil)), r.clientKey(ipRequest(tt.b, nil))
			if a != tt.want {
				t.Errorf("key of %s = %q, want %q", tt.a, a, tt.want)
			}
			if (a == b) != tt.same {
				t.Errorf("keys %q (%s) and %q (%s): same = %v, want %v", a, tt.a, b, tt.b, a == b, tt.same)
			}
		})
	}
	t.Run("from the header", func(t *testing.T) {
		r := mustResolver(t, XForwardedFor, proxies, 48)
		got := r.clientKey(ipRequest("10.0.0.1:80", map[string][]string{"X-Forwarded-For": {"2001:db8:1:2::5"}}))
		if want := "2001:db8:1::/48"; got != want {
			t.Errorf("clientKey = %q, want %q", got, want)
		}
	})
}

func TestClientKeyUnparsedPeer(t *testing.T) {
	tests := []struct{ remote, want string }{
		{"", "unknown"},
		{"@", "@"},
		{"garbage", "garbage"},
		{"203.0.113.7:123456", "203.0.113.7:123456"},
		{"203.0.113.7:", "203.0.113.7:"},
		{"[203.0.113.7]:80", "[203.0.113.7]:80"},
		{"[2001:db8::1", "[2001:db8::1"},
		{"203.0.113.7 ", "203.0.113.7_"},
		{"203.0.113.7\x00", "203.0.113.7_"},
		{"a b\tc\r\nd\x7f\xff", "a_b_c__d__"},
		{"héllo", "h__llo"},
		{strings.Repeat("x", 100), strings.Repeat("x", 64)},
	}
	for _, proxied := range []bool{false, true} {
		r := mustResolver(t, 0, nil, 64)
		if proxied {
			r = mustResolver(t, XForwardedFor, []string{"0.0.0.0/0", "::/0"}, 64)
		}
		for _, tt := range tests {
			req := ipRequest(tt.remote, map[string][]string{"X-Forwarded-For": {"198.51.100.9"}})
			if got := r.clientKey(req); got != tt.want {
				t.Errorf("proxied %v: clientKey(RemoteAddr %q) = %q, want %q", proxied, tt.remote, got, tt.want)
			}
		}
	}
	if got := mustResolver(t, 0, nil, 64).clientKey(nil); got != "unknown" {
		t.Errorf("clientKey(nil) = %q, want %q", got, "unknown")
	}
	if got := mustResolver(t, XForwardedFor, proxies, 64).clientKey(&http.Request{RemoteAddr: "10.0.0.1:80"}); got != "10.0.0.1" {
		t.Errorf("clientKey of a request with a nil Header = %q, want the peer", got)
	}
}

// TestClientKeyBounds checks that a header's work is bounded: past maxHops
// or maxEntryLen the client falls back to the peer.
func TestClientKeyBounds(t *testing.T) {
	trustedHops := func(n int) []string {
		hops := make([]string, n)
		for i := range hops {
			hops[i] = fmt.Sprintf("10.0.%d.%d", i/256, i%256)
		}
		return hops
	}
	list := func(hops ...string) string { return strings.Join(hops, ", ") }
	forwarded := func(hops ...string) string { return "for=" + strings.Join(hops, ", for=") }
	lines := func(hops ...string) []string { return hops }
	huge := strings.Repeat("x", 1<<20)
	tests := []struct {
		name   string
		header ProxyHeader
		lines  []string
		want   string
	}{
		{"client is the 32nd hop", XForwardedFor, lines(list(append([]string{"203.0.113.7"}, trustedHops(31)...)...)), "203.0.113.7"},
		{"client is the 33rd hop", XForwardedFor, lines(list(append([]string{"203.0.113.7"}, trustedHops(32)...)...)), "10.0.0.1"},
		{"32 trusted hops: leftmost", XForwardedFor, lines(list(trustedHops(32)...)), "10.0.0.0"},
		{"33 trusted hops", XForwardedFor, lines(list(trustedHops(33)...)), "10.0.0.1"},
		{"33 trusted lines", XForwardedFor, trustedHops(33), "10.0.0.1"},
		{"Forwarded client is the 32nd hop", Forwarded, lines(forwarded(append([]string{"203.0.113.7"}, trustedHops(31)...)...)), "203.0.113.7"},
		{"Forwarded 33 trusted hops", Forwarded, lines(forwarded(trustedHops(33)...)), "10.0.0.1"},
		{"many trusted hops", XForwardedFor, lines(list(trustedHops(50000)...)), "10.0.0.1"},
		{"huge entry", XForwardedFor, lines(huge), "10.0.0.1"},
		{"huge entry left of the client", XForwardedFor, lines(huge + ", 203.0.113.7"), "203.0.113.7"},
		{"entry of maxEntryLen", XForwardedFor, lines(strings.Repeat(" ", maxEntryLen-len("203.0.113.7")) + "203.0.113.7"), "203.0.113.7"},
		{"entry past maxEntryLen", XForwardedFor, lines("198.51.100.9," + strings.Repeat(" ", maxEntryLen+1-len("203.0.113.7")) + "203.0.113.7"), "10.0.0.1"},
		{"Forwarded huge element", Forwarded, lines(huge), "10.0.0.1"},
		{"Forwarded huge quoted string", Forwarded, lines(`for=203.0.113.7;ext="` + huge + `"`), "10.0.0.1"},
		{"Forwarded huge unterminated quote left of the client", Forwarded, lines(`ext="` + huge + ", for=203.0.113.7"), "203.0.113.7"},
		{"Forwarded quotes", Forwarded, lines(strings.Repeat(`"`, 1<<20)), "10.0.0.1"},
		{"Forwarded backslashes", Forwarded, lines(strings.Repeat(`\"`, 1<<19)), "10.0.0.1"},
		{"Forwarded element of maxEntryLen", Forwarded, lines("for=203.0.113.7;ext=" + strings.Repeat("x", maxEntryLen-len("for=203.0.113.7;ext="))), "203.0.113.7"},
		{"Forwarded element past maxEntryLen", Forwarded, lines("for=198.51.100.9,for=203.0.113.7;ext=" + strings.Repeat("x", maxEntryLen+1-len("for=203.0.113.7;ext="))), "10.0.0.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustResolver(t, tt.header, proxies, 64)
			req := ipRequest("10.0.0.1:80", map[string][]string{tt.header.String(): tt.lines})
			if got := r.clientKey(req); got != tt.want {
				t.Errorf("clientKey = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestClientKeyAllocs checks the hot path: an untrusted IPv4 peer's key
// is cut from RemoteAddr, and a header's costs only the key itself.
func TestClientKeyAllocs(t *testing.T) {
	for _, bc := range clientKeyBenchmarks {
		t.Run(bc.name, func(t *testing.T) {
			r := mustResolver(t, bc.header, bc.trusted, 64)
			if got := testing.AllocsPerRun(100, func() { r.clientKey(bc.req) }); got > float64(bc.allocs) {
				t.Errorf("clientKey allocates %v times, want at most %d", got, bc.allocs)
			}
		})
	}
}

// clientKeyBenchmarks are the hot paths [BenchmarkClientKey] measures,
// with the allocations each may make.
var clientKeyBenchmarks = []struct {
	name    string
	header  ProxyHeader
	trusted []string
	req     *http.Request
	allocs  int
}{
	{"untrusted_IPv4_peer", XForwardedFor, proxies,
		ipRequest("203.0.113.7:5678", map[string][]string{"X-Forwarded-For": {"198.51.100.9"}}), 0},
	{"untrusted_IPv6_peer", XForwardedFor, proxies,
		ipRequest("[2001:db8:cafe::17]:5678", nil), 1},
	{"trusted_XFF_chain_of_3", XForwardedFor, proxies,
		ipRequest("10.0.0.1:80", map[string][]string{"X-Forwarded-For": {"203.0.113.7, 10.0.0.3, 10.0.0.2"}}), 1},
	{"Forwarded_chain", Forwarded, proxies,
		ipRequest("10.0.0.1:80", map[string][]string{"Forwarded": {`for="[2001:db8:cafe::17]:4711";proto=https, for=10.0.0.3, for=10.0.0.2;by=10.0.0.1`}}), 1},
}

func BenchmarkClientKey(b *testing.B) {
	for _, bc := range clientKeyBenchmarks {
		b.Run(bc.name, func(b *testing.B) {
			r := mustResolver(b, bc.header, bc.trusted, 64)
			b.ReportAllocs()
			for b.Loop() {
				r.clientKey(bc.req)
			}
		})
	}
}
