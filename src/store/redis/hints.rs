//! What to do about a Redis failure, said in its message: a TLS/plain mismatch, a certificate
//! not trusted or without the name asked for, a client certificate wanted, a refused password.
//! By the words the redis crate and rustls use (their error kinds reach us as text), and with
//! rustls's debug spelling of names (`DnsName("x")`) turned into the names themselves.

/// `message` in plain words, with what to do when it is a failure we can tell. `tls`: the
/// connection was asked to speak TLS (a `rediss://` URL or `tls` options).
pub fn explained(message: &str, tls: bool) -> String {
    let text = plain_names(message);
    match hint(&text.to_ascii_lowercase(), tls) {
        Some(hint) => format!("{text} ({hint})"),
        None => text,
    }
}

fn hint(lower: &str, tls: bool) -> Option<&'static str> {
    let has = |s: &str| lower.contains(s);
    if has("unknownissuer") || has("unknown issuer") {
        return Some(
            "the server's certificate is signed by a CA this client does not trust: give that \
             CA's PEM as redis.tls.ca",
        );
    }
    if has("not valid for name") || has("notvalidforname") {
        return Some(
            "the server's certificate does not carry the name connected to: set \
             redis.tls.servername to a name it carries, or connect by that name",
        );
    }
    if has("certificate") && has("expired") {
        return Some("the server's certificate has expired: renew it on the server");
    }
    if has("certificaterequired") || has("certificate required") {
        return Some(
            "the server asks for a client certificate: give it as redis.tls.cert and \
             redis.tls.key (PEM)",
        );
    }
    if has("invalid peer certificate") {
        return Some("the server's certificate was refused: redis.tls.ca names the CA to trust");
    }
    if has("wrongpass") || has("noauth") || has("invalid password") || has("auth failed") {
        return Some(
            "check the user name and password (in the URL, or redis.username and redis.password)",
        );
    }
    let cut_off = has("connection reset")
        || has("broken pipe")
        || has("unexpected end of file")
        || has("unexpected eof")
        || has("connection closed")
        || has("connection aborted");
    if tls
        && (cut_off
            || has("timed out connecting")
            || has("connecting timed out")
            || has("subscription timed out")
            || has("timed out subscribing")
            || has("corrupt message")
            || has("invalidcontenttype")
            || has("handshake"))
    {
        return Some(
            "this client speaks TLS (rediss://) there: if the server does not speak TLS on that \
             port, use redis://",
        );
    }
    if !tls && cut_off {
        return Some(
            "the server closed the connection before answering: if it speaks TLS on that port, \
             use rediss:// (and redis.tls for a private CA)",
        );
    }
    None
}

/// rustls's `IpAddress(127.0.0.1)` and `DnsName("localhost")` as `127.0.0.1` and `localhost`.
fn plain_names(message: &str) -> String {
    let mut out = message.to_string();
    for (open, close) in [("DnsName(\"", "\")"), ("IpAddress(", ")")] {
        while let Some(start) = out.find(open) {
            let Some(len) = out[start + open.len()..].find(close) else {
                break;
            };
            let name = out[start + open.len()..start + open.len() + len].to_string();
            out.replace_range(start..start + open.len() + len + close.len(), &name);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_failures_say_what_to_do() {
        let name = explained(
            "invalid peer certificate: certificate not valid for name \"cache.example\"; \
             certificate is only valid for IpAddress(127.0.0.1) or DnsName(\"localhost\")",
            true,
        );
        assert!(
            name.contains("only valid for 127.0.0.1 or localhost"),
            "{name}"
        );
        assert!(name.contains("redis.tls.servername"), "{name}");
        assert!(explained("invalid peer certificate: UnknownIssuer", true).contains("redis.tls.ca"));
        assert!(
            explained("received fatal alert: CertificateRequired", true).contains("redis.tls.cert")
        );
        assert!(explained("timed out connecting to Redis", true).contains("use redis://"));
        // The bus's and a sentinel's subscriptions time out as a whole, their connect included:
        // whichever of the tier's connections reports a TLS/plain mismatch first says the same.
        assert!(explained("Redis bus subscription timed out", true).contains("use redis://"));
        assert!(explained("timed out subscribing on a sentinel", true).contains("use redis://"));
        assert!(explained("Connection reset by peer (os error 104)", false).contains("rediss://"));
        // A plain connection that timed out may be anything (a firewall): no guess.
        assert_eq!(
            explained("timed out connecting to Redis", false),
            "timed out connecting to Redis"
        );
        assert!(
            explained("WRONGPASS invalid username-password pair", false).contains("redis.password")
        );
    }
}
