package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/sluicehq/sluice/cmd/sluice-server/internal/rls"
	"github.com/sluicehq/sluice/cmd/sluice-server/internal/rlsconfig"
)

// settle is how long the config's files must be quiet after a change
// before they are read again: an editor or a deploy writes a file in
// several steps (truncate, write, rename; Kubernetes swaps a symlink),
// which would otherwise be read half done and refused.
const settle = 200 * time.Millisecond

// watcher reloads a server's config when its files change. A reload that
// fails (a bad file, or a config the server cannot serve) is logged and
// the config before it keeps serving; calls in flight finish on the
// config they started with.
type watcher struct {
	fs       *fsnotify.Watcher
	path     string
	srv      *rls.Server
	log      *slog.Logger
	reloaded func(error) // may be nil
	done     chan struct{}
	once     sync.Once
}

// newWatcher watches the config at path (a file, or a directory of them)
// for srv. It watches the directory that holds the files, so that a file
// replaced by a rename, or a Kubernetes ConfigMap's symlink swap, is seen.
func newWatcher(path string, srv *rls.Server, log *slog.Logger, reloaded func(error)) (*watcher, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	dir := path
	if !info.IsDir() {
		dir = filepath.Dir(path)
	}
	fs, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("--config: watching %s: %w", dir, err)
	}
	if err := fs.Add(dir); err != nil {
		_ = fs.Close()
		return nil, fmt.Errorf("--config: watching %s: %w", dir, err)
	}
	w := &watcher{fs: fs, path: filepath.Clean(path), srv: srv, log: log, reloaded: reloaded, done: make(chan struct{})}
	go w.run(!info.IsDir())
	return w, nil
}

// run reloads after each burst of changes, until the watcher closes.
// With file, only changes to that file (or to a Kubernetes ConfigMap's
// hidden entries, "..data" and the like) count.
func (w *watcher) run(file bool) {
	defer close(w.done)
	var timer <-chan time.Time
	for {
		select {
		case ev, ok := <-w.fs.Events:
			if !ok {
				return
			}
			if file && ev.Name != w.path && !strings.HasPrefix(filepath.Base(ev.Name), "..") {
				continue
			}
			timer = time.After(settle)
		case err, ok := <-w.fs.Errors:
			if !ok {
				return
			}
			w.log.Warn("config watch", "err", err)
		case <-timer:
			timer = nil
			w.reload()
		}
	}
}

// reload loads the config again and hands it to the server.
func (w *watcher) reload() {
	cfg, err := rlsconfig.Load(w.path)
	if err == nil {
		err = w.srv.SetConfig(cfg)
	}
	if err != nil {
		w.log.Error("config refused: the config before it keeps serving", "err", err)
	} else {
		w.log.Info("config reloaded", "files", cfg.Files, "domains", cfg.Domains())
	}
	if w.reloaded != nil {
		w.reloaded(err)
	}
}

// Close stops watching, and waits for a reload under way to finish.
func (w *watcher) Close() error {
	var err error
	w.once.Do(func() {
		err = w.fs.Close()
		<-w.done
	})
	if errors.Is(err, fsnotify.ErrClosed) {
		return nil
	}
	return err
}
