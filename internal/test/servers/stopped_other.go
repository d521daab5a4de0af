//go:build !linux

package servers

import (
	"errors"
	"net"
)

// stopped reports whether the server no longer answers: without Linux's
// /proc, a probe that times out is the only sign of a stopped process. A
// server too slow to answer within the probe's deadline looks stopped too.
func (r *Redis) stopped() (bool, error) {
	var netErr net.Error
	err := probe(r.Addr(), r.cmd.Process.Pid)
	return errors.As(err, &netErr) && netErr.Timeout(), nil
}

// processStopped cannot tell without Linux's /proc: it reports the
// process stopped once SIGSTOP has been sent.
func processStopped(int) (bool, error) { return true, nil }
