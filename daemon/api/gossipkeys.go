package api

import (
	"context"
	"net/http"
)

// Gossip keyring operations (POST /v1/gossip/keys).
const (
	GossipKeyInstall = "install"
	GossipKeyUse     = "use"
	GossipKeyRemove  = "remove"
	GossipKeyList    = "list"
)

// GossipKeyRequest asks the daemon to change the cluster keyring on every
// fleet member. Install carries the key (base64, as in a key file); use and
// remove name it by Fingerprint (or Key), so that only installing sends key
// material.
type GossipKeyRequest struct {
	Op          string `json:"op"`
	Key         string `json:"key,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
}

// GossipKeyMember is one member's answer. Keys are fingerprints, never key
// bytes, the one in use first.
type GossipKeyMember struct {
	Node  string   `json:"node"`
	OK    bool     `json:"ok"`
	Error string   `json:"error,omitempty"`
	Keys  []string `json:"keys,omitempty"`
}

// GossipKeysResponse lists every member's answer; Failed counts those that
// did not apply the operation.
type GossipKeysResponse struct {
	Op      string            `json:"op"`
	Members []GossipKeyMember `json:"members"`
	Failed  int               `json:"failed"`
}

// GossipKeys lists the key fingerprints of every fleet member.
func (c *Client) GossipKeys(ctx context.Context) (GossipKeysResponse, error) {
	var out GossipKeysResponse
	err := c.do(ctx, http.MethodGet, "/v1/gossip/keys", nil, &out)
	return out, err
}

// GossipKeyOp installs, uses or removes a cluster key fleet-wide.
func (c *Client) GossipKeyOp(ctx context.Context, req GossipKeyRequest) (GossipKeysResponse, error) {
	var out GossipKeysResponse
	err := c.do(ctx, http.MethodPost, "/v1/gossip/keys", req, &out)
	return out, err
}
