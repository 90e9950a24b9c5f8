//go:build !linux

package sqlite

import (
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// wakeFile is where wake-ups would go: this system has neither inotify
// nor open-file-description locks (see wake_linux.go), so no wake file is
// opened and waiters of other processes poll the database.
type wakeFile struct{}

// haveWakeFile: no wake file is opened here.
const haveWakeFile = false

func openWakeFile(string) (*wakeFile, error) { return nil, nil }

func (*wakeFile) freed(...domain.ResourceRef) {}

func (*wakeFile) close() error { return nil }

func (*wakeFile) Watch(domain.ResourceRef) (<-chan struct{}, func()) { return nil, func() {} }

func (*wakeFile) Contended(domain.ResourceRef) bool { return false }

var _ application.Wakeups = (*wakeFile)(nil)
