//! TLS for every connection the tier opens: the certificates (system roots, a private CA, a
//! client certificate), the server name to verify against, the read lane's rustls config, a
//! client for one server, and the TLS a Cluster's nodes are opened with. Material is checked
//! before use and never quoted in a message.

use super::*;

/// Resolves the certificate's name (`tls.servername`) to the address the URL gave, so the
/// connection goes where the URL says and is verified against the name the user says.
pub(super) struct ServerNameResolver {
    pub(super) servername: String,
    pub(super) address: String,
}

impl AsyncDNSResolver for ServerNameResolver {
    fn resolve<'a, 'b: 'a>(
        &'a self,
        host: &'b str,
        port: u16,
    ) -> RedisFuture<'a, Box<dyn Iterator<Item = SocketAddr> + Send + 'a>> {
        let target = if host == self.servername {
            self.address.clone()
        } else {
            host.to_string()
        };
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((target.as_str(), port))
                .await?
                .collect();
            Ok(Box::new(addrs.into_iter()) as Box<dyn Iterator<Item = SocketAddr> + Send>)
        })
    }
}

pub(super) fn certificates(tls: &TlsOptions) -> TlsCertificates {
    TlsCertificates {
        client_tls: match (&tls.cert, &tls.key) {
            (Some(cert), Some(key)) => Some(ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
            _ => None,
        },
        root_cert: tls.ca.clone(),
    }
}

/// What is wrong with PEM text, worded without quoting it: the PEM library's own messages
/// quote the offending line as bytes, and a key given on one line (an environment variable
/// that lost its newlines) is that line.
pub(super) fn pem_problem(e: &rustls::pki_types::pem::Error) -> &'static str {
    use rustls::pki_types::pem::Error;
    match e {
        Error::MissingSectionEnd { .. } => "a PEM section has no END line",
        Error::IllegalSectionStart { .. } => "a PEM BEGIN line is malformed",
        Error::Base64Decode(_) => "a PEM section's body is not base64",
        Error::NoItemsFound => "no PEM section of the expected kind",
        Error::SectionTooLarge => "a PEM section is larger than 256 MB",
        _ => "not readable PEM",
    }
}

/// Parses the TLS material as the redis crate and the read lane will, so a bad certificate or
/// key is refused here with a message that names the option and never quotes the material.
pub(super) fn check_tls_material(tls: &TlsOptions) -> Result<(), String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = |name: &str, pem: &[u8]| -> Result<(), String> {
        let mut any = false;
        for cert in CertificateDer::pem_slice_iter(pem) {
            cert.map_err(|e| format!("tls.{name}: {}", pem_problem(&e)))?;
            any = true;
        }
        if any {
            Ok(())
        } else {
            Err(format!("tls.{name}: holds no CERTIFICATE section"))
        }
    };
    if let Some(ca) = &tls.ca {
        certs("ca", ca)?;
    }
    if let Some(cert) = &tls.cert {
        certs("cert", cert)?;
    }
    if let Some(key) = &tls.key {
        PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("tls.key: {}", pem_problem(&e)))?;
    }
    Ok(())
}

/// The read lane's TLS client: the private CA or the system roots, and the client certificate,
/// as the command connection is given them (`certificates`). Only for verifying connections; no
/// trusted root refuses TLS (the lane then leaves reads to the command connection).
pub(super) fn lane_tls_config(tls: &TlsOptions) -> Result<rustls::ClientConfig, String> {
    rustls_client(tls, true)
}

/// A rustls client as the redis crate builds one from these options (its
/// `create_rustls_config`): the private CA or the system roots (a failure to load them refuses
/// TLS), and the client certificate. `roots_required`: refuse when no root is trusted. Shared
/// with the guard's dialer (`guard/dial.rs`), which adds `rejectUnauthorized: false`.
pub(in crate::store::redis) fn rustls_client(
    tls: &TlsOptions,
    roots_required: bool,
) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    match &tls.ca {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| format!("tls.ca: {}", pem_problem(&e)))?;
                roots.add(cert).map_err(|e| format!("tls.ca: {e}"))?;
            }
        }
        None => {
            // As the redis crate does: any failure to load the system roots refuses TLS.
            let mut found = rustls_native_certs::load_native_certs();
            if let Some(e) = found.errors.pop() {
                return Err(format!("system roots: {e}"));
            }
            for cert in found.certs {
                roots.add(cert).map_err(|e| format!("system roots: {e}"))?;
            }
        }
    }
    if roots_required && roots.is_empty() {
        return Err("no trusted certificate".into());
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("tls.cert: {}", pem_problem(&e)))?;
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| format!("tls.key: {}", pem_problem(&e)))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("tls.cert/tls.key: {e}"))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// A client for one server: TCP settings, TLS material, the server name, and (for the bus)
/// RESP3, whose push messages carry pub/sub on an ordinary multiplexed connection.
pub(super) fn client(
    info: ConnectionInfo,
    tls: Option<&TlsOptions>,
    resp3: bool,
) -> RedisResult<Client> {
    let mut info = info.set_tcp_settings(tcp_settings());
    if resp3 {
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        info = info.set_redis_settings(settings);
    }
    let Some(tls) = tls else {
        return Client::open(info);
    };
    if let ConnectionAddr::TcpTls { host, port, .. } = info.addr().clone() {
        let host = tls.servername.clone().unwrap_or(host);
        info = info.set_addr(ConnectionAddr::TcpTls {
            host,
            port,
            insecure: !tls.reject_unauthorized,
            tls_params: None,
        });
    }
    Client::build_with_tls(info, certificates(tls))
}

/// Registers the TLS a cluster's nodes are opened with (see `guard::ClusterTls`): keyed by a
/// node's `ConnectionInfo` as the cluster client makes it, with the first seed's credentials
/// and the crate's TLS parameters parsed from the same certificates.
pub(super) fn register_cluster_tls(
    seeds: &[ConnectionInfo],
    tls: &TlsOptions,
) -> RedisResult<Arc<guard::ClusterTls>> {
    let insecure = !tls.reject_unauthorized;
    let first = seeds.first().cloned().ok_or_else(|| {
        RedisError::from((ErrorKind::InvalidClientConfig, "a cluster without seeds"))
    })?;
    let (host, port) = address(first.addr()).unwrap_or_default();
    let node = first.set_addr(ConnectionAddr::TcpTls {
        host,
        port,
        insecure,
        tls_params: None,
    });
    let node = Client::build_with_tls(node, certificates(tls))?;
    Ok(guard::register_cluster_tls(
        node.get_connection_info(),
        seeds,
        tls,
        insecure,
    ))
}
