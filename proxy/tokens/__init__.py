"""Token transport and the token providers (simple and JWT) the proxy resolves identities with."""
