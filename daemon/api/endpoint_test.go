package api

import (
	"math"
	"strings"
	"testing"
)

func TestEndpointValidate(t *testing.T) {
	for _, tc := range []struct {
		ep      Endpoint
		wantErr string
	}{
		{Endpoint{Model: "meta/llama-3-8b", URL: "http://10.0.0.5:8000/v1"}, ""},
		{Endpoint{Model: "m", URL: "https://h"}, ""},
		{Endpoint{Model: "", URL: "http://h:1"}, "model name"},
		{Endpoint{Model: "m", URL: "ftp://h/x"}, "want http:// or https://"},
		{Endpoint{Model: "m", URL: "http://u:p@h:1"}, "no credentials"},
		{Endpoint{Model: "m", URL: "http://h:1/?q=1"}, "no credentials, query"},
		{Endpoint{Model: "m", URL: "http://h:1/#f"}, "fragment"},
		{Endpoint{Model: "m", URL: "http:///path"}, "scheme://host"},
		{Endpoint{Model: "m", URL: "http://h:1/" + strings.Repeat("a", 512)}, "too long"},
		{Endpoint{Model: "m", URL: "http://h:1/a b"}, "too long or has spaces"},
		{Endpoint{Model: "m", URL: "http://h:1/\x7f"}, "invalid control character"},
		{Endpoint{Model: "m", URL: "http://h:1", Speed: 2.5}, ""},
		{Endpoint{Model: "m", URL: "http://h:1", Speed: 1.0 / 64}, ""},
		{Endpoint{Model: "m", URL: "http://h:1", Speed: -1}, "speed -1"},
		{Endpoint{Model: "m", URL: "http://h:1", Speed: 65}, "speed 65"},
		{Endpoint{Model: "m", URL: "http://h:1", Speed: math.NaN()}, "speed NaN"},
		{Endpoint{Model: "m", URL: "http://h:1", Speed: math.Inf(1)}, "speed +Inf"},
	} {
		err := tc.ep.Validate()
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%+v: Validate() = %v, want error containing %q", tc.ep, err, tc.wantErr)
		}
	}
}
