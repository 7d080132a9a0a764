package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/gossip"
)

// GossipKeyring is what the key API needs from fleet membership
// (gossip.Node): keyring operations applied fleet-wide.
type GossipKeyring interface {
	FleetKeys(ctx context.Context, req gossip.KeyRequest) ([]gossip.KeyResult, error)
}

// keyring returns the fleet's keyring, or nil when the daemon runs without
// gossip.
func (d *Daemon) keyring() GossipKeyring {
	k, _ := d.fleet.(GossipKeyring)
	return k
}

func (d *Daemon) handleListGossipKeys(w http.ResponseWriter, r *http.Request) {
	serveListGossipKeys(w, r, d.keyring())
}

func (d *Daemon) handleGossipKeyOp(w http.ResponseWriter, r *http.Request) {
	serveGossipKeyOp(w, r, d.keyring())
}

func serveListGossipKeys(w http.ResponseWriter, r *http.Request, kr GossipKeyring) {
	runGossipKeyOp(w, r, kr, gossip.KeyRequest{Op: gossip.KeyList})
}

// serveGossipKeyOp answers POST /v1/gossip/keys. The API's bearer token (or
// the unix socket's permissions) already guards it; on top of that a key is
// only accepted from a local client, since the API speaks plain HTTP and a
// key seen on the network lets its holder into the fleet.
func serveGossipKeyOp(w http.ResponseWriter, r *http.Request, kr GossipKeyring) {
	var req api.GossipKeyRequest
	if err := decodeJSON(w, r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	kreq, err := gossipKeyRequest(req)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	if req.Key != "" && !localClient(r.RemoteAddr) {
		writeError(w, http.StatusForbidden, fmt.Errorf("a cluster key is only accepted from this host (unix socket or loopback), not from %s: the API is plain HTTP; for use and remove send the fingerprint instead", r.RemoteAddr))
		return
	}
	runGossipKeyOp(w, r, kr, kreq)
}

// gossipKeyRequest checks an API request and turns it into a gossip one.
func gossipKeyRequest(req api.GossipKeyRequest) (gossip.KeyRequest, error) {
	op, err := gossip.ParseKeyOp(req.Op)
	if err != nil {
		return gossip.KeyRequest{}, err
	}
	out := gossip.KeyRequest{Op: op, Fingerprint: req.Fingerprint}
	if req.Key != "" {
		if out.Key, err = gossip.ParseKey(req.Key); err != nil {
			return gossip.KeyRequest{}, err
		}
	}
	switch op {
	case gossip.KeyList:
		return gossip.KeyRequest{}, errors.New("list is GET /v1/gossip/keys")
	case gossip.KeyInstall:
		if out.Key == nil || req.Fingerprint != "" {
			return gossip.KeyRequest{}, errors.New("install takes the key (base64) and no fingerprint")
		}
	case gossip.KeyUse, gossip.KeyRemove:
		switch {
		case out.Key == nil && req.Fingerprint == "":
			return gossip.KeyRequest{}, fmt.Errorf("%s takes the key's fingerprint (or the key)", op)
		case req.Fingerprint != "" && !gossip.ValidFingerprint(req.Fingerprint):
			return gossip.KeyRequest{}, fmt.Errorf("fingerprint %q: want sha256:<16 hex digits>", req.Fingerprint)
		case out.Key != nil && req.Fingerprint != "" && gossip.Fingerprint(out.Key) != req.Fingerprint:
			return gossip.KeyRequest{}, errors.New("the key and the fingerprint do not match")
		}
	}
	return out, nil
}

// localClient reports whether an HTTP client connected over a unix socket
// or from loopback.
func localClient(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return remote == "" || remote == "@" // unix socket peers
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func runGossipKeyOp(w http.ResponseWriter, r *http.Request, kr GossipKeyring, req gossip.KeyRequest) {
	if kr == nil {
		writeError(w, http.StatusServiceUnavailable, errors.New("this daemon runs without gossip"))
		return
	}
	res, err := kr.FleetKeys(r.Context(), req)
	switch {
	case errors.Is(err, gossip.ErrInsecure):
		writeError(w, http.StatusConflict, err)
		return
	case errors.Is(err, gossip.ErrPrimaryKey):
		writeError(w, http.StatusConflict, err)
		return
	case errors.Is(err, gossip.ErrUnknownKey):
		writeError(w, http.StatusNotFound, err)
		return
	case err != nil:
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	out := api.GossipKeysResponse{Op: string(req.Op), Members: make([]api.GossipKeyMember, 0, len(res))}
	for _, m := range res {
		out.Members = append(out.Members, api.GossipKeyMember{Node: m.Node, OK: m.Err == "", Error: m.Err, Keys: m.Keys})
		if m.Err != "" {
			out.Failed++
		}
	}
	writeJSON(w, http.StatusOK, out)
}
