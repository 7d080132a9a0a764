package imagecache

import (
	"context"
	"io"
	"log/slog"

	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
)

// containerdLogger returns a logger for the containerd client's context
// (it logs through logrus) that hands every entry to l instead of the
// global logrus logger. The client's info messages ("trying next host")
// are routine retries, so they become debug.
func containerdLogger(l *slog.Logger) *log.Entry {
	lr := logrus.New()
	lr.SetOutput(io.Discard)
	lr.SetLevel(logrus.DebugLevel)
	lr.AddHook(slogHook{l})
	return logrus.NewEntry(lr)
}

type slogHook struct{ l *slog.Logger }

func (slogHook) Levels() []logrus.Level { return logrus.AllLevels }

func (h slogHook) Fire(e *logrus.Entry) error {
	level := slog.LevelDebug
	switch {
	case e.Level <= logrus.ErrorLevel:
		level = slog.LevelError
	case e.Level == logrus.WarnLevel:
		level = slog.LevelWarn
	}
	ctx := e.Context
	if ctx == nil {
		ctx = context.Background()
	}
	if !h.l.Enabled(ctx, level) {
		return nil
	}
	attrs := make([]any, 0, 2*len(e.Data))
	for k, v := range e.Data {
		attrs = append(attrs, k, v)
	}
	h.l.Log(ctx, level, "containerd client: "+e.Message, attrs...)
	return nil
}
