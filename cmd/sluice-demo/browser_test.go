package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// browserTimeout bounds the whole browser test, so that it can never hang:
// it takes a few seconds, or a few more beside busy CPUs.
const browserTimeout = 90 * time.Second

// TestBrowser drives the page in headless Chromium: it revises the free
// plan with the form, fires a burst as the free tenant, and waits for the
// log to show the denials and the chart to plot every response. It saves a
// screenshot in t.ArtifactDir() (kept with go test -artifacts), and also at
// $SLUICE_DEMO_SCREENSHOT if set.
func TestBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser: skipped with -short")
	}
	chromium := findChromium(t)
	ctx, cancel := context.WithTimeout(t.Context(), browserTimeout)
	defer cancel()
	base := startServer(t, ctx)

	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox, // Chromium's sandbox does not run as root, as CI does
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.WindowSize(1400, 1000),
	)
	defer cancelAlloc() // stops the browser and waits for it
	browser, cancelBrowser := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	defer cancelBrowser()
	problems := watchConsole(t, browser)

	step(t, browser, "load the page",
		chromedp.Navigate(base),
		chromedp.WaitVisible(chromedp.CSS(`button[data-client="free"][data-action="burst"]`)),
		chromedp.WaitReady(chromedp.CSS(`#plan-name option[value="free"]`)),
		chromedp.WaitReady(chromedp.CSS(`#plans-body tr[data-plan="free"]`)),
	)
	if n := evaluate[string](t, browser, `document.querySelector("#chart").dataset.points`); n != "0" {
		t.Fatalf("before any request, the chart has data-points=%q, want 0", n)
	}
	checkLabels(t, browser)

	// Five tokens refilled one an hour: the burst's outcome does not depend
	// on how fast the browser is.
	step(t, browser, "revise the free plan",
		chromedp.SetValue(chromedp.ID("plan-name"), "free"),
		chromedp.SetValue(chromedp.ID("plan-algorithm"), "GCRA"),
		chromedp.SetValue(chromedp.ID("plan-capacity"), "5"),
		chromedp.SetValue(chromedp.ID("plan-refill-tokens"), "1"),
		chromedp.SetValue(chromedp.ID("plan-refill-period"), "1h"),
		chromedp.Click(chromedp.ID("plan-submit")),
		chromedp.WaitVisible(chromedp.CSS(`#plan-status[data-state="ok"]`)),
	)
	// The first edit of a plan is its revision 2, in the table, on its
	// client's card and in the status line.
	revision := evaluate[map[string]string](t, browser, `({
		row: document.querySelector('#plans-body tr[data-plan="free"]').dataset.revision,
		cell: document.querySelector('#plans-body tr[data-plan="free"] td:nth-child(2)').textContent,
		card: document.querySelector('article[data-client="free"] .client-plan .revision').textContent,
		status: document.querySelector("#plan-status").textContent,
	})`)
	if revision["row"] != "2" || revision["cell"] != "2" || revision["card"] != "revision 2" ||
		!strings.Contains(revision["status"], "revision 2") {
		t.Errorf("after the first edit of free: %v, want revision 2 in the table, the card and the status", revision)
	}

	step(t, browser, "fire a burst as the free tenant",
		chromedp.Click(chromedp.CSS(`button[data-client="free"][data-action="burst"]`)),
	)
	// Wait for every response: 20 rows and 20 points, and the buttons
	// enabled again once the burst is over.
	_, err := chromedp.Run(browser, chromedp.Poll[bool](`
		document.querySelectorAll('#log-body tr.status-429[data-client="free"]').length > 0 &&
		document.querySelectorAll('#log-body tr[data-client="free"]').length === 20 &&
		document.querySelector("#chart").dataset.points === "20" &&
		!document.querySelector('button[data-client="free"][data-action="burst"]').disabled`,
		chromedp.WithPollingInterval(50*time.Millisecond),
		chromedp.WithPollingTimeout(60*time.Second)))
	if err != nil {
		rows := evaluate[int](t, browser, `document.querySelectorAll("#log-body tr").length`)
		t.Fatalf("waiting for the burst's 20 responses (%d rows so far): %v", rows, err)
	}

	// The plan allows 5, so exactly 15 of the 20 are denied.
	counts := evaluate[map[string]int](t, browser, `({
		ok: document.querySelectorAll('#log-body tr.status-200[data-client="free"]').length,
		denied: document.querySelectorAll('#log-body tr.status-429[data-client="free"]').length,
		points: Number(document.querySelector("#chart").dataset.points),
		cardDenied: Number(document.querySelector('article[data-client="free"]').dataset.denied),
	})`)
	if counts["ok"] != 5 || counts["denied"] != 15 || counts["points"] != 20 || counts["cardDenied"] != 15 {
		t.Errorf("after the burst: got %v, want 5 rows of 200, 15 of 429, 20 chart points, 15 denied on the card", counts)
	}
	headers := evaluate[string](t, browser, `document.querySelector("#last-headers").textContent`)
	if !strings.Contains(headers, `ratelimit-policy: "free";q=5;w=18000`) {
		t.Errorf("the last response's headers do not show the revised plan:\n%s", headers)
	}

	// Two more clients, so that the chart has a line each: the pro plan's
	// 50 tokens cover a burst of 20 however long it takes.
	step(t, browser, "fire bursts as the pro tenant and anonymous A",
		chromedp.Click(chromedp.CSS(`button[data-client="pro"][data-action="burst"]`)),
		chromedp.Click(chromedp.CSS(`button[data-client="anon-a"][data-action="burst"]`)),
	)
	if _, err := chromedp.Run(browser, chromedp.Poll[bool](`
		document.querySelectorAll('#log-body tr[data-client="pro"]').length === 20 &&
		document.querySelectorAll('#log-body tr[data-client="anon-a"]').length === 20 &&
		document.querySelector("#chart").dataset.points === "60"`,
		chromedp.WithPollingInterval(50*time.Millisecond),
		chromedp.WithPollingTimeout(60*time.Second))); err != nil {
		t.Fatalf("waiting for the other bursts: %v", err)
	}
	if ok := evaluate[int](t, browser, `document.querySelectorAll('#log-body tr.status-200[data-client="pro"]').length`); ok != 20 {
		t.Errorf("pro burst: %d of 20 allowed, want all", ok)
	}

	// The new rows flash for a moment: let them settle for the picture.
	if _, err := chromedp.Run(browser, chromedp.Poll[bool](`document.querySelectorAll(".fresh, .updated").length === 0`,
		chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("waiting for the rows to settle: %v", err)
	}
	screenshot(t, browser)
	for _, p := range problems() {
		t.Errorf("browser console: %s", p)
	}
}

// findChromium returns the path of Chromium, or skips the test without it
// (fails it under CI=true, where it must run).
func findChromium(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err == nil {
		return path
	}
	msg := "chromium is not on PATH: install it to run the browser test (Debian: apt-get install chromium)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// startServer serves the demo on a free loopback port until the test ends,
// through the same serve the command runs, and returns the page's URL.
func startServer(t *testing.T, ctx context.Context) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	served := make(chan error, 1)
	go func() { served <- serve(ctx, ln, options{}, testLogger(t)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String() + "/"
}

// step runs actions, failing the test with what it was doing.
func step(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func evaluate[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluating %s: %v", js, err)
	}
	return v
}

// watchConsole collects the page's errors: uncaught exceptions, console
// errors and the browser's own (a resource that failed, a
// Content-Security-Policy violation). It returns a func that lists them.
func watchConsole(t *testing.T, ctx context.Context) func() []string {
	var (
		mu       sync.Mutex
		problems []string
		done     = make(chan struct{})
	)
	ctx, stop := context.WithCancel(ctx)
	messages := chromedp.Console(ctx)
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			if expected429(m) {
				continue
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				mu.Lock()
				problems = append(problems, m.String())
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { stop(); <-done })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), problems...)
	}
}

// expected429 reports the browser's log entry for a denied request, which
// the page expects: Chromium logs every 4xx response as an error.
func expected429(m chromedp.ConsoleMessage) bool {
	return m.Source == "network" && strings.Contains(m.Text, "status of 429")
}

// checkLabels asserts the basics of an accessible page: every control has
// a label, every button a name.
func checkLabels(t *testing.T, ctx context.Context) {
	t.Helper()
	unlabelled := evaluate[[]string](t, ctx, `[
		...[...document.querySelectorAll("input, select")].filter((e) => e.labels.length === 0).map((e) => e.id || e.name),
		...[...document.querySelectorAll("button")].filter((b) => !(b.getAttribute("aria-label") || b.textContent.trim())).map((b) => b.outerHTML),
	]`)
	for _, u := range unlabelled {
		t.Errorf("no label or name: %s", u)
	}
}

// screenshot saves the whole page as a PNG in the test's artifact
// directory, and at $SLUICE_DEMO_SCREENSHOT if set.
func screenshot(t *testing.T, ctx context.Context) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // 100: PNG, not JPEG
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	paths := []string{filepath.Join(t.ArtifactDir(), "sluice-demo.png")}
	if p := os.Getenv("SLUICE_DEMO_SCREENSHOT"); p != "" {
		paths = append(paths, p)
	}
	for _, p := range paths {
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Errorf("screenshot: %v", err)
			continue
		}
		t.Log("screenshot:", p)
	}
}
