package image

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/space-sandbox/space/internal/errdefs"
)

// Registry timeouts: an unreachable registry must fail in seconds, not minutes. Layer bodies
// have no overall deadline (they may be large); the caller's context bounds them.
const (
	dialTimeout           = 5 * time.Second
	tlsHandshakeTimeout   = 5 * time.Second
	responseHeaderTimeout = 30 * time.Second
)

// remoteImage resolves ref on its registry. Loopback registries are spoken to over plain HTTP.
func remoteImage(ctx context.Context, refStr string, opts Options) (v1.Image, func(error) error, func(), error) {
	ref, err := name.ParseReference(refStr)
	if err != nil {
		return nil, nil, nil, errdefs.InvalidArgument(fmt.Sprintf("invalid image reference %q: %v", refStr, err))
	}
	host := ref.Context().RegistryStr()
	if isLoopback(host) {
		if ref, err = name.ParseReference(refStr, name.Insecure); err != nil {
			return nil, nil, nil, errdefs.InvalidArgument(fmt.Sprintf("invalid image reference %q: %v", refStr, err))
		}
	}
	kc := opts.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	tr := newTransport()
	classify := func(err error) error { return classifyRemote(err, refStr, host) }
	img, err := remote.Image(ref,
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(kc),
		remote.WithTransport(tr),
		remote.WithPlatform(v1.Platform{OS: platformOS, Architecture: platformArch}),
		remote.WithRetryBackoff(remote.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 3}),
		remote.WithRetryPredicate(retryable),
	)
	if err != nil {
		tr.CloseIdleConnections()
		return nil, nil, nil, classify(err)
	}
	return img, classify, tr.CloseIdleConnections, nil
}

func newTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   tlsHandshakeTimeout,
		ResponseHeaderTimeout: responseHeaderTimeout,
		ExpectContinueTimeout: time.Second,
	}
}

// isLoopback reports whether a registry host[:port] is this machine: localhost, 127.0.0.0/8 or
// ::1. Docker speaks plain HTTP to those by default, and so do we.
func isLoopback(hostport string) bool {
	h, _, err := net.SplitHostPort(hostport)
	if err != nil {
		h = hostport
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// retryable retries transient registry trouble (5xx, 429, a reset connection) a couple of times,
// but never a registry that cannot be reached at all: that must fail fast.
func retryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if unreachable(err) {
		return false
	}
	var te *transport.Error
	if errors.As(err, &te) {
		return te.Temporary()
	}
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// unreachable reports errors that mean no conversation with the registry was possible.
func unreachable(err error) bool {
	var (
		op       *net.OpError
		dns      *net.DNSError
		certErr  *tls.CertificateVerificationError
		recErr   tls.RecordHeaderError
		authErr  x509.UnknownAuthorityError
		hostErr  x509.HostnameError
		invalErr x509.CertificateInvalidError
	)
	switch {
	case errors.As(err, &op) && op.Op == "dial":
		return true
	case errors.As(err, &dns), errors.As(err, &certErr), errors.As(err, &recErr),
		errors.As(err, &authErr), errors.As(err, &hostErr), errors.As(err, &invalErr):
		return true
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return true
	}
	return false
}

// classifyRemote maps a registry error to SPACE's error classes.
func classifyRemote(err error, ref, host string) error {
	if err == nil {
		return nil
	}
	if hasClass(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("pull image %s: %w", ref, err)
	}
	var te *transport.Error
	if errors.As(err, &te) {
		switch {
		case te.StatusCode == http.StatusNotFound || hasCode(te, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode):
			return errdefs.NotFound(fmt.Sprintf("image %s not found", ref))
		case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden ||
			hasCode(te, transport.UnauthorizedErrorCode, transport.DeniedErrorCode):
			return errdefs.New(errdefs.ErrPermissionDenied, fmt.Sprintf("registry %s denied access to image %s (are you logged in?): %v", host, ref, err))
		case te.StatusCode == http.StatusTooManyRequests || te.StatusCode >= 500:
			return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("registry %s failed: %v", host, err))
		case hasCode(te, transport.NameInvalidErrorCode, transport.TagInvalidErrorCode):
			return errdefs.InvalidArgument(fmt.Sprintf("registry %s rejected reference %s: %v", host, ref, err))
		}
		return fmt.Errorf("pull image %s: %w", ref, err)
	}
	var ue *url.Error
	if unreachable(err) || errors.As(err, &ue) {
		return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("registry %s unreachable: %v", host, err))
	}
	return fmt.Errorf("pull image %s: %w", ref, err)
}

func hasCode(te *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range te.Errors {
		for _, c := range codes {
			if d.Code == c {
				return true
			}
		}
	}
	return false
}

// hasClass reports whether err already carries one of SPACE's error classes.
func hasClass(err error) bool {
	for _, c := range []error{
		errdefs.ErrNotFound, errdefs.ErrAlreadyExists, errdefs.ErrInvalidArgument, errdefs.ErrFailedPrecondition,
		errdefs.ErrUnavailable, errdefs.ErrResourceExhausted, errdefs.ErrPermissionDenied,
		errdefs.ErrUnauthenticated, errdefs.ErrTooLarge,
	} {
		if errors.Is(err, c) {
			return true
		}
	}
	return false
}
