package api

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/warmfleet/warmfleet/spec"
)

// Validate checks an endpoint registration from outside (an API body, a
// manifest).
func (ep Endpoint) Validate() error {
	var errs []error
	errs = append(errs, spec.ValidateModelName(ep.Model))
	u, err := url.Parse(ep.URL)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("url %q: %w", ep.URL, err))
	case u.Scheme != "http" && u.Scheme != "https":
		errs = append(errs, fmt.Errorf("url %q: want http:// or https://", ep.URL))
	case u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "":
		errs = append(errs, fmt.Errorf("url %q: want scheme://host:port[/path] with no credentials, query or fragment", ep.URL))
	case len(ep.URL) > 512 || strings.ContainsAny(ep.URL, " \t\r\n"):
		errs = append(errs, fmt.Errorf("url %q: too long or has spaces", ep.URL))
	}
	if ep.Speed != 0 && !(ep.Speed >= 1.0/MaxEndpointSpeed && ep.Speed <= MaxEndpointSpeed) {
		errs = append(errs, fmt.Errorf("speed %v: want 1/%d..%d relative to the fleet's usual backend (0: 1)", ep.Speed, MaxEndpointSpeed, MaxEndpointSpeed))
	}
	return errors.Join(errs...)
}

// MaxEndpointSpeed bounds Endpoint.Speed both ways, as the router bounds a
// backend's (balance.MaxSpeed): the API does not import the router.
const MaxEndpointSpeed = 64
