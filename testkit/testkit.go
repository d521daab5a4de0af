// Package testkit starts real servers for the tests of a service that uses
// sluice: a standalone Redis ([StartRedis]), a Redis Cluster of three
// masters ([StartCluster]), a Redis watched by a Sentinel ([StartSentinel])
// and a PostgreSQL database of the test's own ([Postgres]), each with one
// call and each removed by t.Cleanup. [CheckInstances] runs the
// two-instance check of sluice-verify from a test: two OS processes of the
// test binary, each with many goroutines and the service's own backend,
// share one bucket, and the test fails with sluice-verify's report if they
// were admitted more than the bucket allows, or fewer.
//
// It is a module of its own, so that importing sluice pulls in none of its
// container dependencies.
//
// # Containers or binaries
//
// The servers run in containers, through testcontainers-go, when a
// container engine answers (Docker, or Podman's Docker-compatible API, as
// testcontainers-go finds it: $DOCKER_HOST and the like); else they run as
// processes of the redis-server and PostgreSQL binaries on PATH (Debian's
// /usr/lib/postgresql/<version>/bin too). $SLUICE_TESTKIT=containers or
// binaries chooses. With neither an engine nor the binaries the test is
// skipped, or fails when $CI is set: CI must run it.
//
// The images are the official ones, [DefaultRedisImage] and
// [DefaultPostgresImage], unless $SLUICE_REDIS_IMAGE or
// $SLUICE_POSTGRES_IMAGE names others (an image of your registry's mirror,
// or one built locally). A cluster's nodes announce 127.0.0.1 and the ports
// the test dials, in one of two layouts ([EnvClusterLayout]); the Sentinel
// and its master use the host's network, which needs an engine on the
// test's own Linux host (not Docker Desktop's VM).
//
// # Clean-up
//
// Each server goes with t.Cleanup, but for the PostgreSQL server that
// [Postgres] shares among a test binary's tests: wrap the package's
// testing.M in [Main] so that it goes when the tests end. testcontainers-go's
// reaper (Ryuk) removes whatever a killed test binary leaves; where its
// image cannot be pulled, set TESTCONTAINERS_RYUK_DISABLED=true and remove
// leftovers by their label, org.testcontainers=true.
package testkit

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
)

// The environment variables the kit reads.
const (
	// EnvMode chooses where servers run: "containers" or "binaries". Unset,
	// containers when an engine answers, else binaries.
	EnvMode = "SLUICE_TESTKIT"
	// EnvRedisImage names the image of Redis and Sentinel containers.
	EnvRedisImage = "SLUICE_REDIS_IMAGE"
	// EnvPostgresImage names the image of PostgreSQL containers.
	EnvPostgresImage = "SLUICE_POSTGRES_IMAGE"
)

// The default images.
const (
	DefaultRedisImage    = "redis:7"
	DefaultPostgresImage = "postgres:16-alpine"
)

// Mode is where the kit runs servers.
type Mode string

// The modes.
const (
	Containers Mode = "containers"
	Binaries   Mode = "binaries"
)

// engineTimeout bounds the check that a container engine answers.
const engineTimeout = 5 * time.Second

// startTimeout bounds the start of one container, image pull included.
const startTimeout = 3 * time.Minute

var (
	engineOnce sync.Once
	engineErr  error
)

// engine reports whether a container engine answers, asking it once per
// test binary.
func engine() error {
	engineOnce.Do(func() {
		defer func() {
			// testcontainers-go panics when it finds no engine at all.
			if r := recover(); r != nil {
				engineErr = fmt.Errorf("no container engine: %v", r)
			}
		}()
		p, err := testcontainers.ProviderDocker.GetProvider()
		if err != nil {
			engineErr = err
			return
		}
		defer p.Close()
		ctx, cancel := context.WithTimeout(context.Background(), engineTimeout)
		defer cancel()
		engineErr = p.Health(ctx)
	})
	return engineErr
}

// ModeOf returns the mode the kit runs servers in for t: $SLUICE_TESTKIT's,
// else containers if an engine answers, else binaries. A value of
// $SLUICE_TESTKIT it does not know fails t, and so does containers when no
// engine answers.
func ModeOf(t testing.TB) Mode {
	t.Helper()
	switch m := Mode(os.Getenv(EnvMode)); m {
	case Containers:
		if err := engine(); err != nil {
			t.Fatalf("testkit: %s=%s, but no container engine answers: %v", EnvMode, m, err)
		}
		return m
	case Binaries:
		return m
	case "":
		if engine() == nil {
			return Containers
		}
		return Binaries
	default:
		t.Fatalf("testkit: %s=%q: want %q or %q (or unset: containers when an engine answers)", EnvMode, m, Containers, Binaries)
		return ""
	}
}

// image returns the image $env names, or def.
func image(env, def string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	return def
}

// startContext is the context a container starts in: t.Context, which
// ends with the test, bounded by startTimeout.
func startContext(t testing.TB) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.Context(), startTimeout)
}
