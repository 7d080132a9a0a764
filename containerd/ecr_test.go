package imagecache

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ecr"
	"github.com/aws/aws-sdk-go-v2/service/ecr/types"
)

func TestParseECRHost(t *testing.T) {
	for _, tc := range []struct {
		host, account, region string
		ok                    bool
	}{
		{"123456789012.dkr.ecr.us-east-1.amazonaws.com", "123456789012", "us-east-1", true},
		{"123456789012.dkr.ecr.us-east-1.amazonaws.com:443", "123456789012", "us-east-1", true},
		{"123456789012.dkr.ecr-fips.us-gov-west-1.amazonaws.com", "123456789012", "us-gov-west-1", true},
		{"123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn", "123456789012", "cn-north-1", true},
		{"123456789012.dkr-ecr.eu-west-1.on.aws", "123456789012", "eu-west-1", true},
		{"123456789012.DKR.ECR.US-EAST-1.AMAZONAWS.COM", "123456789012", "us-east-1", true},
		{"public.ecr.aws", "", "", false},
		{"12345678901.dkr.ecr.us-east-1.amazonaws.com", "", "", false},
		{"123456789012.dkr.ecr.us-east-1.amazonaws.com.evil.io", "", "", false},
		{"evil.io/123456789012.dkr.ecr.us-east-1.amazonaws.com", "", "", false},
		{"123456789012.dkr.ecr..amazonaws.com", "", "", false},
		{"docker.io", "", "", false},
		{"", "", "", false},
	} {
		a, r, ok := ParseECRHost(tc.host)
		if a != tc.account || r != tc.region || ok != tc.ok {
			t.Errorf("ParseECRHost(%q) = %q, %q, %v; want %q, %q, %v", tc.host, a, r, ok, tc.account, tc.region, tc.ok)
		}
	}
}

func TestDecodeECRToken(t *testing.T) {
	enc := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	for _, tc := range []struct {
		token string
		want  Credential
		err   string
	}{
		{enc("AWS:eyJwYXlsb2Fk:with:colons"), Credential{"AWS", "eyJwYXlsb2Fk:with:colons"}, ""},
		{"%%%", Credential{}, "not base64"},
		{enc("AWS"), Credential{}, "user:password"},
		{enc(":pw"), Credential{}, "user:password"},
		{enc("AWS:"), Credential{}, "user:password"},
	} {
		got, err := decodeECRToken(tc.token)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("decodeECRToken(%q) err = %v, want %q", tc.token, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("decodeECRToken(%q) = %+v, %v", tc.token, got, err)
		}
	}
}

// fakeECR answers GetAuthorizationToken from a script; it stands in for
// AWS, which tests cannot reach.
type fakeECR struct {
	calls   int
	token   string
	expires time.Time
	err     error
}

func (f *fakeECR) GetAuthorizationToken(context.Context, *ecr.GetAuthorizationTokenInput, ...func(*ecr.Options)) (*ecr.GetAuthorizationTokenOutput, error) {
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	return &ecr.GetAuthorizationTokenOutput{AuthorizationData: []types.AuthorizationData{{
		AuthorizationToken: aws.String(base64.StdEncoding.EncodeToString([]byte("AWS:" + f.token))),
		ExpiresAt:          aws.Time(f.expires),
	}}}, nil
}

func TestECRTokenCache(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fake := &fakeECR{token: "one", expires: now.Add(12 * time.Hour)}
	var regions []string
	tok := newECRTokens(func() time.Time { return now })
	tok.newClient = func(_ context.Context, region string) (ecrAPI, error) {
		regions = append(regions, region)
		return fake, nil
	}
	host := "123456789012.dkr.ecr.eu-central-1.amazonaws.com"
	get := func() Credential {
		t.Helper()
		c, err := tok.credential(t.Context(), host)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if c := get(); c != (Credential{"AWS", "one"}) || fake.calls != 1 || regions[0] != "eu-central-1" {
		t.Fatalf("first: %+v, %d calls, regions %v", c, fake.calls, regions)
	}
	now = now.Add(11 * time.Hour) // 1 h left: still cached
	fake.token = "two"
	if c := get(); c.Secret != "one" || fake.calls != 1 {
		t.Fatalf("cached token not used: %+v, %d calls", c, fake.calls)
	}
	now = now.Add(50 * time.Minute) // 10 min left: refresh
	if c := get(); c.Secret != "two" || fake.calls != 2 {
		t.Fatalf("token not refreshed before expiry: %+v, %d calls", c, fake.calls)
	}
	fake.err = errors.New("AccessDenied")
	now = now.Add(13 * time.Hour)
	if _, err := tok.credential(t.Context(), host); err == nil || !strings.Contains(err.Error(), "AccessDenied") {
		t.Fatalf("err = %v", err)
	}
	if _, err := tok.credential(t.Context(), "docker.io"); err == nil {
		t.Fatal("credential for a non-ECR host")
	}
}

func FuzzParseECRHost(f *testing.F) {
	f.Add("123456789012.dkr.ecr.us-east-1.amazonaws.com")
	f.Add("123456789012.dkr-ecr.eu-west-1.on.aws:443")
	f.Fuzz(func(t *testing.T, host string) {
		account, region, ok := ParseECRHost(host)
		if !ok {
			return
		}
		if len(account) != 12 || region == "" || strings.ContainsAny(region, "./:") {
			t.Fatalf("ParseECRHost(%q) = %q, %q", host, account, region)
		}
	})
}

func FuzzDecodeECRToken(f *testing.F) {
	f.Add(base64.StdEncoding.EncodeToString([]byte("AWS:secret")))
	f.Add("")
	f.Fuzz(func(t *testing.T, token string) {
		c, err := decodeECRToken(token)
		if err == nil && (c.Username == "" || c.Secret == "") {
			t.Fatalf("decodeECRToken(%q) = %+v without error", token, c)
		}
	})
}
