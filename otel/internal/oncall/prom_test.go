package oncall

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// prometheusBin is where Debian's prometheus package puts the server;
// PATH is looked in first.
const prometheusBin = "/usr/bin/prometheus"

// promServer is a Prometheus server the run started.
type promServer struct {
	base string // "http://127.0.0.1:port"
}

// startPrometheus starts a Prometheus server that scrapes target (a
// /metrics URL) every second into a TSDB in a temporary directory, and
// waits until it is ready and the target is up. Without a server, or
// when it does not come up, the test fails: the run is nothing without
// it. t.Cleanup stops it.
func startPrometheus(t testing.TB, target string) *promServer {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		bin = prometheusBin
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("oncall: no Prometheus server (%v); run.sh installs it: apt-get install -y prometheus", err)
	}
	u, err := url.Parse(target)
	if err != nil {
		t.Fatalf("oncall: target %q: %v", target, err)
	}
	dir := t.TempDir()
	conf := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: oncall
    metrics_path: %s
    static_configs:
      - targets: [%q]
`, u.Path, u.Host)
	confPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	logPath := filepath.Join(dir, "prometheus.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin,
		"--config.file="+confPath,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn",
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("oncall: start %s: %v", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("oncall: prometheus log:\n%s", tail(b, 4000))
		}
	})
	p := &promServer{base: "http://" + addr}

	// Ready, then the target scraped and up: a run that starts its
	// traffic before the first scrape would lose its baseline's start.
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(p.base + "/-/ready")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("oncall: prometheus exited at start: %v\n%s", cmd.ProcessState, tail(b, 4000))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("oncall: prometheus at %s not ready after 30s", p.base)
		}
	}
	for {
		v, err := p.instant(`up{job="oncall"}`, time.Now())
		if err == nil && len(v) == 1 && v[0].Value == 1 {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("oncall: prometheus does not see %s up after 30s (last: %v, %v)", target, v, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// freeAddr returns a 127.0.0.1 address whose port was free a moment ago.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("oncall: find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// sample is one instant value.
type sample struct {
	Metric map[string]string
	Value  float64
}

// series is one series of a range query, with its values by Unix
// second.
type series struct {
	Metric map[string]string
	Times  []float64
	Values []float64
}

// at returns the value at Unix second ts, if the series has one within
// half a second.
func (s series) at(ts float64) (float64, bool) {
	for i, t := range s.Times {
		if t > ts-0.5 && t <= ts+0.5 {
			return s.Values[i], true
		}
	}
	return 0, false
}

type apiResponse struct {
	Status    string `json:"status"`
	ErrorType string `json:"errorType"`
	Error     string `json:"error"`
	Data      struct {
		ResultType string            `json:"resultType"`
		Result     []json.RawMessage `json:"result"`
	} `json:"data"`
}

// get calls the HTTP API at path with form and decodes its answer.
func (p *promServer) get(path string, form url.Values) (apiResponse, error) {
	var r apiResponse
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.base+path, bytes.NewBufferString(form.Encode()))
	if err != nil {
		return r, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return r, fmt.Errorf("%s: %s: %w", path, resp.Status, err)
	}
	if r.Status != "success" {
		return r, fmt.Errorf("%s: %s: %s", path, r.ErrorType, r.Error)
	}
	return r, nil
}

// instant runs expr at ts (/api/v1/query).
func (p *promServer) instant(expr string, ts time.Time) ([]sample, error) {
	r, err := p.get("/api/v1/query", url.Values{"query": {expr}, "time": {unix(ts)}})
	if err != nil {
		return nil, err
	}
	var out []sample
	for _, raw := range r.Data.Result {
		var v struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, err
		}
		f, err := parseValue(v.Value[1])
		if err != nil {
			return nil, err
		}
		out = append(out, sample{v.Metric, f})
	}
	return out, nil
}

// rangeQuery runs expr from start to end at a step of one second
// (/api/v1/query_range), the scrape interval.
func (p *promServer) rangeQuery(expr string, start, end time.Time) ([]series, error) {
	r, err := p.get("/api/v1/query_range", url.Values{
		"query": {expr}, "start": {unix(start)}, "end": {unix(end)}, "step": {"1s"},
	})
	if err != nil {
		return nil, err
	}
	var out []series
	for _, raw := range r.Data.Result {
		var v struct {
			Metric map[string]string `json:"metric"`
			Values [][2]any          `json:"values"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, err
		}
		s := series{Metric: v.Metric}
		for _, pt := range v.Values {
			ts, ok := pt[0].(float64)
			if !ok {
				return nil, fmt.Errorf("query_range: timestamp %v", pt[0])
			}
			f, err := parseValue(pt[1])
			if err != nil {
				return nil, err
			}
			s.Times = append(s.Times, ts)
			s.Values = append(s.Values, f)
		}
		out = append(out, s)
	}
	return out, nil
}

// parseValue reads a sample value, which the API sends as a string
// ("NaN" and "+Inf" included).
func parseValue(v any) (float64, error) {
	s, ok := v.(string)
	if !ok {
		return 0, fmt.Errorf("sample value %v is not a string", v)
	}
	return strconv.ParseFloat(s, 64)
}

func unix(t time.Time) string {
	return strconv.FormatFloat(float64(t.UnixMilli())/1000, 'f', 3, 64)
}
