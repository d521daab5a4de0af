package oncall

import (
	"fmt"
	"time"
)

// The schedule, from the start of the abuse phase, which is on a whole
// minute of the wall clock. sluice_rate_limit_rejected_keys reports the
// previous whole minute, so a phase can be read off it only once it has
// held for a whole minute and the gauge has turned over: the abuse phase
// runs one whole minute and 10s more, the misconfigured phase starts
// then and holds the next whole minute (120s to 180s) and 10s more. The
// sick phase needs no gauge: its stages take 20s, 20s, 25s and 25s, the
// last two long enough for a 30s rate to settle.
const (
	minBaseline     = 35 * time.Second
	abuseAt         = 0 * time.Second
	misconfiguredAt = 70 * time.Second
	sickAt          = 190 * time.Second
	slowerAt        = 210 * time.Second // DEBUG SLEEP 15ms instead of 5ms
	pausedAt        = 230 * time.Second // SIGSTOP
	resumedAt       = 255 * time.Second // SIGCONT
	endAt           = 280 * time.Second

	// The sleeps: 5ms, then 15ms, slow but within the fail policy's 50ms
	// deadline, so that the latency rises before decisions degrade.
	slowSleep   = "0.005"
	slowerSleep = "0.015"
)

// schedule places the phases on the wall clock.
type schedule struct {
	start time.Time // the baseline starts
	abuse time.Time // the abuse phase starts, on a whole minute
}

// newSchedule starts the baseline at start and the abuse phase on the
// first whole minute at least minBaseline later.
func newSchedule(start time.Time) schedule {
	a := start.Add(minBaseline).Truncate(time.Minute)
	if a.Before(start.Add(minBaseline)) {
		a = a.Add(time.Minute)
	}
	return schedule{start: start, abuse: a}
}

func (s schedule) at(d time.Duration) time.Time { return s.abuse.Add(d) }

func (s schedule) end() time.Time { return s.at(endAt) }

// phaseStart is when p starts; numPhases gives the end of the run.
func (s schedule) phaseStart(p phase) time.Time {
	switch p {
	case baseline:
		return s.start
	case abuse:
		return s.at(abuseAt)
	case misconfigured:
		return s.at(misconfiguredAt)
	case sick:
		return s.at(sickAt)
	}
	return s.end()
}

func (s schedule) phaseAt(t time.Time) phase {
	for p := numPhases - 1; p > baseline; p-- {
		if !t.Before(s.phaseStart(p)) {
			return p
		}
	}
	return baseline
}

// secs is t in seconds from the start of the run, the figures' x.
func (s schedule) secs(t time.Time) float64 { return t.Sub(s.start).Seconds() }

// A stage is a stretch of the sick phase.
type stage struct {
	name     string
	from, to time.Duration
}

var stages = []stage{
	{"store slow (DEBUG SLEEP 5ms loop)", sickAt, slowerAt},
	{"store slower (DEBUG SLEEP 15ms loop)", slowerAt, pausedAt},
	{"store paused (SIGSTOP)", pausedAt, resumedAt},
	{"store resumed (SIGCONT)", resumedAt, endAt},
}

// A readPoint is a time results.txt gives every query's value at.
type readPoint struct {
	name string
	at   time.Time
}

// readPoints are the middle of each phase (of each stage, for the sick
// one) and, for the gauge, the end of the abuse and misconfigured
// phases, 5s before, once the gauge reports the phase's whole minute.
func (s schedule) readPoints() []readPoint {
	mid := func(a, b time.Time) time.Time { return a.Add(b.Sub(a) / 2).Truncate(time.Second) }
	pts := []readPoint{
		{"baseline, middle", mid(s.start, s.abuse)},
		{"abuse, middle", mid(s.at(abuseAt), s.at(misconfiguredAt))},
		{"abuse, end (gauge: its minute)", s.at(misconfiguredAt - 5*time.Second)},
		{"misconfigured, middle", mid(s.at(misconfiguredAt), s.at(sickAt))},
		{"misconfigured, end (gauge: its minute)", s.at(sickAt - 5*time.Second)},
	}
	for _, st := range stages {
		pts = append(pts, readPoint{"sick: " + st.name + ", middle", mid(s.at(st.from), s.at(st.to))})
	}
	return pts
}

// describe is the schedule for results.txt, in seconds from the start.
func (s schedule) describe() string {
	out := fmt.Sprintf("baseline 0-%.0fs, abuse %.0f-%.0fs, misconfigured %.0f-%.0fs, sick %.0f-%.0fs\n",
		s.secs(s.abuse), s.secs(s.at(abuseAt)), s.secs(s.at(misconfiguredAt)),
		s.secs(s.at(misconfiguredAt)), s.secs(s.at(sickAt)), s.secs(s.at(sickAt)), s.secs(s.end()))
	for _, st := range stages {
		out += fmt.Sprintf("  sick: %s %.0f-%.0fs\n", st.name, s.secs(s.at(st.from)), s.secs(s.at(st.to)))
	}
	return out
}
