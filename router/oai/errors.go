package oai

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Error types and codes used in OpenAI-style error bodies.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeRateLimit      = "rate_limit_error"
	TypeServer         = "server_error"
	TypeNotFound       = "not_found_error"
)

// APIError is the body `{"error":{"message":..,"type":..,"code":..}}`.
type APIError struct {
	Status     int           `json:"-"`
	Message    string        `json:"message"`
	Type       string        `json:"type"`
	Code       string        `json:"code"`
	Param      any           `json:"param"`
	RetryAfter time.Duration `json:"-"`
}

func (e *APIError) Error() string { return e.Message }

// WriteError writes e as an OpenAI-style JSON error response. A positive
// RetryAfter becomes a Retry-After header in whole seconds (at least 1).
func WriteError(w http.ResponseWriter, e *APIError) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.RetryAfter > 0 {
		secs := int((e.RetryAfter + time.Second - 1) / time.Second)
		h.Set("Retry-After", strconv.Itoa(max(secs, 1)))
	}
	body := e.body()
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(e.Status)
	_, _ = w.Write(append(body, '\n'))
}

// body is e as the JSON object `{"error":{...}}`.
func (e *APIError) body() []byte {
	body, err := json.Marshal(struct {
		Error *APIError `json:"error"`
	}{e})
	if err != nil {
		// Only strings and nil are marshalled; cannot fail, but never send nothing.
		body = []byte(`{"error":{"message":"internal error","type":"server_error","code":"internal_error","param":null}}`)
	}
	return body
}

// ErrorEvent is e as a server-sent event, `data: {"error":{...}}`, the
// way a stream that has begun reports a failure: OpenAI's clients raise
// it as an error instead of taking the stream as complete.
func ErrorEvent(e *APIError) []byte {
	return append(append([]byte("data: "), e.body()...), "\n\n"...)
}
