package imagecache

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ecr"
)

// ecrHostPattern matches private ECR registry hosts in every partition
// (the same set amazon-ecr-credential-helper accepts, plus the dual-stack
// "dkr-ecr.<region>.on.aws" form). Groups: account, region.
var ecrHostPattern = regexp.MustCompile(`^([0-9]{12})\.dkr[.-]ecr(?:-fips)?\.([a-z0-9][a-z0-9-]*)\.(?:amazonaws\.com(?:\.cn)?|on\.aws|sc2s\.sgov\.gov|c2s\.ic\.gov|cloud\.adc-e\.uk|csp\.hci\.ic\.gov)$`)

// ParseECRHost reports whether host (optionally with a port) is a private
// Amazon ECR registry and returns its account and region.
func ParseECRHost(host string) (account, region string, ok bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	m := ecrHostPattern.FindStringSubmatch(strings.ToLower(host))
	if m == nil {
		return "", "", false
	}
	return m[1], m[2], true
}

// decodeECRToken splits an ECR authorization token (base64 of
// "AWS:<password>") into the basic-auth pair the registry expects.
func decodeECRToken(token string) (Credential, error) {
	raw, err := base64.StdEncoding.DecodeString(token)
	if err != nil {
		return Credential{}, fmt.Errorf("ecr token is not base64: %w", err)
	}
	user, pass, ok := strings.Cut(string(raw), ":")
	if !ok || user == "" || pass == "" {
		return Credential{}, errors.New("ecr token does not decode to user:password")
	}
	return Credential{Username: user, Secret: pass}, nil
}

// ecrAPI is the one ECR call the cache makes.
type ecrAPI interface {
	GetAuthorizationToken(ctx context.Context, in *ecr.GetAuthorizationTokenInput, opts ...func(*ecr.Options)) (*ecr.GetAuthorizationTokenOutput, error)
}

// ecrTokens fetches ECR tokens through the AWS SDK's default credential
// chain and caches one per region until shortly before it expires (tokens
// last 12 hours; a pull should not start with one about to lapse).
type ecrTokens struct {
	newClient func(ctx context.Context, region string) (ecrAPI, error)
	now       func() time.Time

	mu     sync.Mutex
	cached map[string]ecrToken
}

type ecrToken struct {
	cred    Credential
	expires time.Time
}

// ecrRefreshBefore is how long before expiry a cached token is replaced.
const ecrRefreshBefore = 15 * time.Minute

// ecrDefaultLifetime is assumed when ECR reports no expiry.
const ecrDefaultLifetime = time.Hour

func newECRTokens(now func() time.Time) *ecrTokens {
	return &ecrTokens{
		newClient: func(ctx context.Context, region string) (ecrAPI, error) {
			// The default chain: environment, shared config, web identity
			// (IRSA), ECS/EKS pod identity, EC2 instance role. The SDK's own
			// HTTP client is kept so AWS_CA_BUNDLE keeps working.
			cfg, err := config.LoadDefaultConfig(ctx, config.WithRegion(region))
			if err != nil {
				return nil, fmt.Errorf("aws config: %w", err)
			}
			return ecr.NewFromConfig(cfg), nil
		},
		now:    now,
		cached: map[string]ecrToken{},
	}
}

// credential returns a token for the ECR registry host.
func (t *ecrTokens) credential(ctx context.Context, host string) (Credential, error) {
	_, region, ok := ParseECRHost(host)
	if !ok {
		return Credential{}, fmt.Errorf("%s is not an ECR registry", host)
	}
	t.mu.Lock()
	tok, ok := t.cached[region]
	t.mu.Unlock()
	if ok && t.now().Before(tok.expires.Add(-ecrRefreshBefore)) {
		return tok.cred, nil
	}
	api, err := t.newClient(ctx, region)
	if err != nil {
		return Credential{}, fmt.Errorf("ecr %s: %w", region, err)
	}
	out, err := api.GetAuthorizationToken(ctx, &ecr.GetAuthorizationTokenInput{})
	if err != nil {
		return Credential{}, fmt.Errorf("ecr %s: get authorization token: %w", region, err)
	}
	if len(out.AuthorizationData) == 0 || out.AuthorizationData[0].AuthorizationToken == nil {
		return Credential{}, fmt.Errorf("ecr %s: no authorization data in response", region)
	}
	d := out.AuthorizationData[0]
	cred, err := decodeECRToken(*d.AuthorizationToken)
	if err != nil {
		return Credential{}, fmt.Errorf("ecr %s: %w", region, err)
	}
	expires := t.now().Add(ecrDefaultLifetime)
	if d.ExpiresAt != nil {
		expires = *d.ExpiresAt
	}
	t.mu.Lock()
	t.cached[region] = ecrToken{cred: cred, expires: expires}
	t.mu.Unlock()
	return cred, nil
}
