//! The client certificate for brokers that authenticate clients by TLS (mTLS): PEM certificate
//! and key, or a PKCS#12 keystore with its password (the two forms Strimzi writes for a
//! `KafkaUser` with `authentication: tls`). Either way librdkafka gets PEM
//! (`ssl.certificate.pem`, `ssl.key.pem`): no file path reaches the client, and the operator's
//! probe, which holds Secret values in memory only, works the same as a replicator pod.

use openssl::pkcs12::Pkcs12;
use openssl::pkey::PKey;
use openssl::x509::X509;

use super::config::ConfigError;
use super::secrets::SecretFiles;
use crate::api::TlsSpec;

/// A client certificate and its private key, PEM.
pub struct ClientIdentity {
    pub cert_pem: String,
    pub key_pem: String,
}

/// The client certificate `tls` names, read and checked; `None` when it names none. `field` is
/// the cluster's spec path (`spec.source`).
pub fn client_certificate(
    tls: &TlsSpec,
    field: &str,
    secrets: &SecretFiles,
) -> Result<Option<ClientIdentity>, ConfigError> {
    let invalid = |name: &str, message: String| ConfigError::ClientCertificate {
        field: format!("{field}.tls.{name}"),
        message,
    };
    match (
        (&tls.cert_secret_ref, &tls.key_secret_ref),
        (&tls.pkcs12_secret_ref, &tls.pkcs12_password_secret_ref),
    ) {
        ((None, None), (None, None)) => Ok(None),
        ((Some(cert), Some(key)), (None, None)) => {
            let cert_pem = secrets.read(&format!("{field}.tls.certSecretRef"), cert)?;
            let key_pem = secrets.read(&format!("{field}.tls.keySecretRef"), key)?;
            let certs = X509::stack_from_pem(cert_pem.as_bytes()).unwrap_or_default();
            let Some(leaf) = certs.first() else {
                return Err(invalid(
                    "certSecretRef",
                    format!("Secret '{}' key '{}' holds no PEM certificate", cert.name, cert.key),
                ));
            };
            let pkey = PKey::private_key_from_pem(key_pem.as_bytes()).map_err(|_| {
                invalid(
                    "keySecretRef",
                    format!(
                        "Secret '{}' key '{}' holds no unencrypted PEM private key",
                        key.name, key.key
                    ),
                )
            })?;
            if !leaf.public_key().is_ok_and(|public| public.public_eq(&pkey)) {
                return Err(invalid(
                    "keySecretRef",
                    "the private key does not belong to the certificate in certSecretRef".into(),
                ));
            }
            Ok(Some(ClientIdentity { cert_pem, key_pem }))
        }
        ((None, None), (Some(store), Some(password))) => {
            let der = secrets.read_bytes(&format!("{field}.tls.pkcs12SecretRef"), store)?;
            let pass = secrets.read(&format!("{field}.tls.pkcs12PasswordSecretRef"), password)?;
            let parsed = Pkcs12::from_der(&der)
                .map_err(|_| {
                    invalid(
                        "pkcs12SecretRef",
                        format!("Secret '{}' key '{}' is not a PKCS#12 keystore", store.name, store.key),
                    )
                })?
                .parse2(&pass)
                .map_err(|_| {
                    invalid(
                        "pkcs12PasswordSecretRef",
                        format!(
                            "the PKCS#12 keystore in Secret '{}' does not open with the password in Secret '{}' key '{}'",
                            store.name, password.name, password.key
                        ),
                    )
                })?;
            let (Some(cert), Some(pkey)) = (parsed.cert, parsed.pkey) else {
                return Err(invalid(
                    "pkcs12SecretRef",
                    "the PKCS#12 keystore holds no certificate with its private key".into(),
                ));
            };
            let pem = |r: Result<Vec<u8>, openssl::error::ErrorStack>| {
                r.ok().and_then(|b| String::from_utf8(b).ok()).ok_or_else(|| {
                    invalid("pkcs12SecretRef", "the keystore's certificate could not be read".into())
                })
            };
            let mut cert_pem = pem(cert.to_pem())?;
            // The chain Strimzi puts in the keystore goes with the certificate.
            for extra in parsed.ca.iter().flatten() {
                cert_pem.push_str(&pem(extra.to_pem())?);
            }
            let key_pem = pem(pkey.private_key_to_pem_pkcs8())?;
            Ok(Some(ClientIdentity { cert_pem, key_pem }))
        }
        ((Some(_), Some(_)), (Some(_), _)) | ((Some(_), Some(_)), (_, Some(_))) => Err(invalid(
            "pkcs12SecretRef",
            "give the client certificate once: as PEM (certSecretRef, keySecretRef) or as PKCS#12 (pkcs12SecretRef, pkcs12PasswordSecretRef)".into(),
        )),
        ((Some(_), None), _) | ((None, Some(_)), _) => Err(invalid(
            if tls.cert_secret_ref.is_some() { "keySecretRef" } else { "certSecretRef" },
            "certSecretRef and keySecretRef go together: the client certificate and its private key".into(),
        )),
        (_, (Some(_), None)) | (_, (None, Some(_))) => Err(invalid(
            if tls.pkcs12_secret_ref.is_some() { "pkcs12PasswordSecretRef" } else { "pkcs12SecretRef" },
            "pkcs12SecretRef and pkcs12PasswordSecretRef go together: the keystore and its password".into(),
        )),
    }
}

/// A self-signed certificate for tests, valid for a day.
#[cfg(test)]
pub(crate) fn self_signed(cn: &str) -> (X509, PKey<openssl::pkey::Private>) {
    use openssl::asn1::Asn1Time;
    use openssl::hash::MessageDigest;
    use openssl::rsa::Rsa;
    use openssl::x509::X509NameBuilder;

    let key = PKey::from_rsa(Rsa::generate(2048).unwrap()).unwrap();
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", cn).unwrap();
    let name = name.build();
    let mut b = X509::builder().unwrap();
    b.set_version(2).unwrap();
    b.set_subject_name(&name).unwrap();
    b.set_issuer_name(&name).unwrap();
    b.set_pubkey(&key).unwrap();
    b.set_not_before(&Asn1Time::days_from_now(0).unwrap())
        .unwrap();
    b.set_not_after(&Asn1Time::days_from_now(1).unwrap())
        .unwrap();
    b.sign(&key, MessageDigest::sha256()).unwrap();
    (b.build(), key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::SecretKeyRef;

    fn r(key: &str) -> Option<SecretKeyRef> {
        Some(SecretKeyRef {
            name: "user".into(),
            key: key.into(),
        })
    }

    fn files(pairs: &[(&str, Vec<u8>)]) -> SecretFiles {
        SecretFiles::from_values(
            pairs
                .iter()
                .map(|(k, v)| (("user".to_string(), k.to_string()), v.clone()))
                .collect(),
        )
    }

    #[test]
    fn pem_and_pkcs12_give_the_same_identity_to_the_client() {
        let (cert, key) = self_signed("flow-user");
        let cert_pem = cert.to_pem().unwrap();
        let key_pem = key.private_key_to_pem_pkcs8().unwrap();
        let p12 = Pkcs12::builder()
            .name("flow-user")
            .pkey(&key)
            .cert(&cert)
            .build2("s3cret")
            .unwrap()
            .to_der()
            .unwrap();
        let secrets = files(&[
            ("user.crt", cert_pem.clone()),
            ("user.key", key_pem.clone()),
            ("user.p12", p12),
            ("user.password", b"s3cret".to_vec()),
            ("wrong.password", b"nope".to_vec()),
        ]);
        let pem = TlsSpec {
            cert_secret_ref: r("user.crt"),
            key_secret_ref: r("user.key"),
            ..Default::default()
        };
        let id = client_certificate(&pem, "spec.source", &secrets)
            .unwrap()
            .unwrap();
        // Text values lose a file's trailing newline; PEM does not need it.
        let text = |b: &[u8]| String::from_utf8_lossy(b).trim_end().to_string();
        assert_eq!(id.cert_pem.trim_end(), text(&cert_pem));
        let store = TlsSpec {
            pkcs12_secret_ref: r("user.p12"),
            pkcs12_password_secret_ref: r("user.password"),
            ..Default::default()
        };
        let from_store = client_certificate(&store, "spec.source", &secrets)
            .unwrap()
            .unwrap();
        assert_eq!(from_store.cert_pem.trim_end(), id.cert_pem.trim_end());
        assert_eq!(from_store.key_pem.trim_end(), text(&key_pem));

        let wrong = TlsSpec {
            pkcs12_password_secret_ref: r("wrong.password"),
            ..store
        };
        let err = client_certificate(&wrong, "spec.source", &secrets)
            .err()
            .unwrap();
        assert!(
            err.to_string()
                .starts_with("spec.source.tls.pkcs12PasswordSecretRef: "),
            "{err}"
        );
    }

    #[test]
    fn a_key_of_another_certificate_or_half_a_pair_is_named() {
        let (cert, _) = self_signed("a");
        let (_, other_key) = self_signed("b");
        let secrets = files(&[
            ("user.crt", cert.to_pem().unwrap()),
            ("user.key", other_key.private_key_to_pem_pkcs8().unwrap()),
        ]);
        let mismatched = TlsSpec {
            cert_secret_ref: r("user.crt"),
            key_secret_ref: r("user.key"),
            ..Default::default()
        };
        let err = client_certificate(&mismatched, "spec.target", &secrets)
            .err()
            .unwrap();
        assert!(err.to_string().contains("does not belong"), "{err}");
        let half = TlsSpec {
            cert_secret_ref: r("user.crt"),
            ..Default::default()
        };
        let err = client_certificate(&half, "spec.target", &secrets)
            .err()
            .unwrap();
        assert!(
            err.to_string()
                .starts_with("spec.target.tls.keySecretRef: "),
            "{err}"
        );
        assert!(
            client_certificate(&TlsSpec::default(), "spec.target", &secrets)
                .unwrap()
                .is_none()
        );
    }
}
