package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/health"
	"github.com/warmfleet/warmfleet/internal/bearer"
	"github.com/warmfleet/warmfleet/internal/manifest"
	"github.com/warmfleet/warmfleet/nvme"
	"github.com/warmfleet/warmfleet/spec"
)

// maxBodyBytes bounds an API request body; specs are small.
const maxBodyBytes = 64 << 10

// Handler is the daemon's HTTP API, ready when its state reads. token, when
// set, must be sent as a bearer token on every request.
func (d *Daemon) Handler(token string) http.Handler { return d.APIHandler(token, d.StateErr) }

// APIHandler is the daemon's HTTP API with /readyz answering from ready, so
// the API and the metrics listener (package health) report one readiness.
func (d *Daemon) APIHandler(token string, ready func() error) http.Handler {
	mux := http.NewServeMux()
	health.Mount(mux, d.metrics.reg, ready)
	mux.HandleFunc("GET /v1/node", d.handleNode)
	mux.HandleFunc("GET /v1/caches", d.handleCaches)
	mux.HandleFunc("POST /v1/caches", d.handleAddCache)
	mux.HandleFunc("GET /v1/caches/{name...}", d.handleCache)
	mux.HandleFunc("DELETE /v1/caches/{name...}", d.handleRemoveCache)
	mux.HandleFunc("POST /v1/verify/{name...}", d.handleVerify)
	mux.HandleFunc("GET /v1/fleet", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, d.Fleet()) })
	mux.HandleFunc("GET /v1/images", d.handleImages)
	mux.HandleFunc("POST /v1/images", d.handleAddImage)
	mux.HandleFunc("DELETE /v1/images", d.handleRemoveImage)
	mux.HandleFunc("GET /v1/endpoints", d.handleEndpoints)
	mux.HandleFunc("POST /v1/endpoints", d.handleAddEndpoint)
	mux.HandleFunc("DELETE /v1/endpoints", d.handleRemoveEndpoint)
	mux.HandleFunc("POST /v1/apply", d.handleApply)
	mux.HandleFunc("GET /v1/apply-dir", d.handleApplyDir)
	mux.HandleFunc("GET /v1/gossip/keys", d.handleListGossipKeys)
	mux.HandleFunc("POST /v1/gossip/keys", d.handleGossipKeyOp)
	return bearer.Require(token, mux, func(w http.ResponseWriter) {
		writeError(w, http.StatusUnauthorized, errors.New("missing or wrong bearer token"))
	})
}

// StateErr reports why the daemon's state cannot be read, or nil.
func (d *Daemon) StateErr() error {
	_, err := d.state.records()
	return err
}

func (d *Daemon) handleNode(w http.ResponseWriter, _ *http.Request) {
	n, err := d.Node()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, n)
}

func (d *Daemon) handleCaches(w http.ResponseWriter, _ *http.Request) {
	all, err := d.Caches()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, all)
}

func (d *Daemon) handleCache(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	st, found, err := d.Cache(name)
	switch {
	case err != nil:
		writeError(w, http.StatusInternalServerError, err)
	case !found:
		writeError(w, http.StatusNotFound, fmt.Errorf("model %q: %w", name, nvme.ErrNotFound))
	default:
		writeJSON(w, http.StatusOK, st)
	}
}

// decodeSpec reads a request that becomes a spec and validates it,
// answering 400 itself when it is bad.
func decodeSpec[R interface{ Spec() spec.Spec }](w http.ResponseWriter, r *http.Request, req *R) (spec.Spec, bool) {
	if err := decodeJSON(w, r, req); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return spec.Spec{}, false
	}
	s := (*req).Spec()
	if err := s.Validate(); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return spec.Spec{}, false
	}
	return s, true
}

// writeRemoved answers a DELETE: 204, 404 with notFound, or 500.
func writeRemoved(w http.ResponseWriter, found bool, err error, notFound error) {
	switch {
	case err != nil:
		writeError(w, http.StatusInternalServerError, err)
	case !found:
		writeError(w, http.StatusNotFound, notFound)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

func (d *Daemon) handleAddCache(w http.ResponseWriter, r *http.Request) {
	var req api.AddCacheRequest
	s, ok := decodeSpec(w, r, &req)
	if !ok {
		return
	}
	if err := d.AddCache(r.Context(), s); err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	st, _, err := d.Cache(s.Name)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusAccepted, st)
}

func (d *Daemon) handleVerify(w http.ResponseWriter, r *http.Request) {
	res, err := d.Verify(r.Context(), r.PathValue("name"))
	switch {
	case errors.Is(err, nvme.ErrNotFound):
		writeError(w, http.StatusNotFound, err)
	case errors.Is(err, ErrBusy), errors.Is(err, ErrNotReady):
		writeError(w, http.StatusConflict, err)
	case err != nil:
		writeError(w, http.StatusInternalServerError, err)
	default:
		writeJSON(w, http.StatusOK, res)
	}
}

func (d *Daemon) handleRemoveCache(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	found, err := d.RemoveCache(r.Context(), name)
	writeRemoved(w, found, err, fmt.Errorf("model %q is not a desired cache", name))
}

func (d *Daemon) handleImages(w http.ResponseWriter, r *http.Request) {
	all, err := d.Images(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	writeJSON(w, http.StatusOK, all)
}

func (d *Daemon) handleAddImage(w http.ResponseWriter, r *http.Request) {
	var req api.AddImageRequest
	s, ok := decodeSpec(w, r, &req)
	if !ok {
		return
	}
	if d.images == nil {
		writeError(w, http.StatusConflict, ErrImagesOff)
		return
	}
	if err := d.AddImage(r.Context(), s); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	writeJSON(w, http.StatusAccepted, req)
}

// handleRemoveImage takes ref and owner as query parameters: a reference
// does not fit a path segment.
func (d *Daemon) handleRemoveImage(w http.ResponseWriter, r *http.Request) {
	ref, owner := r.URL.Query().Get("ref"), r.URL.Query().Get("owner")
	found, err := d.RemoveImage(r.Context(), ref, owner)
	writeRemoved(w, found, err, fmt.Errorf("no claim on %q by owner %q", ref, owner))
}

func (d *Daemon) handleEndpoints(w http.ResponseWriter, _ *http.Request) {
	eps, err := d.Endpoints()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, eps)
}

func (d *Daemon) handleAddEndpoint(w http.ResponseWriter, r *http.Request) {
	var ep api.Endpoint
	if err := decodeJSON(w, r, &ep); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	if err := ep.Validate(); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	if ep.AppliedBy != "" {
		writeError(w, http.StatusBadRequest, errors.New("applied_by is set by apply only (POST /v1/apply)"))
		return
	}
	if err := d.AddEndpoint(r.Context(), ep); err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusCreated, ep)
}

// handleRemoveEndpoint takes the URL as a query parameter: it does not fit a
// path segment.
func (d *Daemon) handleRemoveEndpoint(w http.ResponseWriter, r *http.Request) {
	u := r.URL.Query().Get("url")
	found, err := d.RemoveEndpoint(r.Context(), u)
	writeRemoved(w, found, err, fmt.Errorf("endpoint %q is not registered", u))
}

// decodeJSON reads one JSON object, strictly: bounded size, no unknown
// fields, nothing after it.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	return decodeJSONMax(w, r, v, maxBodyBytes)
}

// decodeJSONMax is decodeJSON with a body of at most limit bytes.
func decodeJSONMax(w http.ResponseWriter, r *http.Request, v any, limit int64) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return fmt.Errorf("content type %q: want application/json", ct)
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return fmt.Errorf("request body larger than %d bytes", limit)
		}
		return fmt.Errorf("bad JSON body: %w", err)
	}
	// More misses a stray '}' or ']' after the value; only EOF means the
	// body was one value.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("bad JSON body: more than one value, or data after it")
	}
	return nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, api.Error{Error: err.Error()})
}

// Listen opens the API listener. A unix socket left by a dead daemon is
// replaced; one that still answers means another daemon runs. A TCP address
// that is not loopback requires a token.
func Listen(ctx context.Context, addr api.Addr, token string) (net.Listener, error) {
	if addr.Network == "tcp" {
		if token == "" && !addr.Loopback() {
			return nil, fmt.Errorf("api %s is reachable from other hosts: give a bearer token (--api-token-file)", addr)
		}
		var lc net.ListenConfig
		return lc.Listen(ctx, "tcp", addr.Address)
	}
	if c, err := net.DialTimeout("unix", addr.Address, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("api socket %s is in use: is another daemon running?", addr.Address)
	}
	if err := os.MkdirAll(filepath.Dir(addr.Address), 0o755); err != nil {
		return nil, fmt.Errorf("api socket: %w", err)
	}
	// Only a socket is ours to replace: a mistyped path that names a file
	// or directory is an error, never something to delete.
	if fi, err := os.Lstat(addr.Address); err == nil && fi.Mode().Type() != os.ModeSocket {
		return nil, fmt.Errorf("api socket %s: a file that is not a socket is there (mode %s): refusing to replace it", addr.Address, fi.Mode())
	}
	if err := os.Remove(addr.Address); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("api socket: %w", err)
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "unix", addr.Address)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(addr.Address, 0o660); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// maxApplyBytes bounds an apply's body: as much as the files of one
// `apply -f` may hold (manifest.MaxBytes), as JSON.
const maxApplyBytes = 8 << 20

func (d *Daemon) handleApply(w http.ResponseWriter, r *http.Request) {
	var req api.ApplyRequest
	if err := decodeJSONMax(w, r, &req, maxApplyBytes); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	res, err := d.Apply(r.Context(), req)
	var conflict *manifest.ConflictError
	switch {
	case errors.Is(err, ErrBadApply):
		writeError(w, http.StatusBadRequest, err)
	case errors.As(err, &conflict):
		writeError(w, http.StatusConflict, err)
	case err != nil:
		writeError(w, http.StatusInternalServerError, err)
	default:
		writeJSON(w, http.StatusOK, res)
	}
}

func (d *Daemon) handleApplyDir(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, d.ApplyDirStatus())
}
