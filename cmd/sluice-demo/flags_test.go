package main

import (
	"errors"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    options
		wantErr string // a part of the error; "" for none
	}{
		{args: nil, want: options{replicas: 1, listen: ":8080"}},
		{args: []string{"--listen", "127.0.0.1:0"}, want: options{replicas: 1, listen: "127.0.0.1:0"}},
		{args: []string{"-listen=[::1]:9000"}, want: options{replicas: 1, listen: "[::1]:9000"}},
		{args: []string{"--redis", "127.0.0.1:6379"}, want: options{replicas: 1, listen: ":8080", redisAddrs: []string{"127.0.0.1:6379"}}},
		{args: []string{"--redis", "a:7000, b:7001", "--cluster"}, want: options{replicas: 1, listen: ":8080", redisAddrs: []string{"a:7000", "b:7001"}, cluster: true}},
		{args: []string{"--redis", "seed:7000", "--cluster"}, want: options{replicas: 1, listen: ":8080", redisAddrs: []string{"seed:7000"}, cluster: true}},

		{args: []string{"--redis", "127.0.0.1:6379", "--replicas", "2"}, want: options{replicas: 2, listen: ":8080", redisAddrs: []string{"127.0.0.1:6379"}}},
		{args: []string{"--redis", "a:7000", "--cluster", "-replicas=1000"}, want: options{replicas: 1000, listen: ":8080", redisAddrs: []string{"a:7000"}, cluster: true}},
		{args: []string{"--replicas", "1"}, want: options{replicas: 1, listen: ":8080"}},

		{args: []string{"--listen", "8080"}, wantErr: `--listen "8080": want host:port`},
		{args: []string{"--listen", ""}, wantErr: `--listen "": want host:port`},
		{args: []string{"--listen", ":http"}, wantErr: `--listen ":http": port "http" is not a number`},
		{args: []string{"--listen", ":65536"}, wantErr: `--listen ":65536": port "65536"`},
		{args: []string{"--redis", "localhost"}, wantErr: `--redis "localhost": address 1 "localhost": want host:port`},
		{args: []string{"--redis", ":6379"}, wantErr: `--redis ":6379": address 1 ":6379": missing host`},
		{args: []string{"--redis", "a:1,b:2"}, wantErr: `--redis "a:1,b:2": a list of addresses needs --cluster`},
		{args: []string{"--redis", "a:1,,b:2", "--cluster"}, wantErr: `--redis "a:1,,b:2": address 2 "": want host:port`},
		{args: []string{"--redis", "a:1", "--replicas", "0"}, wantErr: "--replicas 0: want 1 to 1000"},
		{args: []string{"--redis", "a:1", "--replicas", "-2"}, wantErr: "--replicas -2: want 1 to 1000"},
		{args: []string{"--redis", "a:1", "--replicas", "1001"}, wantErr: "--replicas 1001: want 1 to 1000"},
		{args: []string{"--redis", "a:1", "--replicas", "two"}, wantErr: `--replicas "two": not a whole number`},
		{args: []string{"--redis", "a:1", "--replicas", ""}, wantErr: `--replicas "": not a whole number`},
		{args: []string{"--redis", "a:1", "--replicas", "99999999999999999999"}, wantErr: `--replicas "99999999999999999999": not a whole number`},
		{args: []string{"--replicas", "2"}, wantErr: "--replicas 2 needs --redis"},
		{args: []string{"--cluster"}, wantErr: "--cluster needs --redis"},
		{args: []string{"--listen", ":8080", "serve"}, wantErr: `unexpected argument "serve"`},
		{args: []string{"--redis"}, wantErr: "flag needs an argument: -redis"},
		{args: []string{"--nope"}, wantErr: "flag provided but not defined: -nope"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			got, err := parseFlags(tc.args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.listen != tc.want.listen || got.replicas != tc.want.replicas || got.cluster != tc.want.cluster || !slices.Equal(got.redisAddrs, tc.want.redisAddrs) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseFlagsHelp(t *testing.T) {
	var out strings.Builder
	_, err := parseFlags([]string{"-h"}, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: got %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"--listen", "-redis", "-cluster", "-replicas", "Usage: sluice-demo"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("usage does not mention %q:\n%s", want, out.String())
		}
	}
}
