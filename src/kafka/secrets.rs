//! Secret values for client configurations. The operator mounts each Secret at
//! `<secrets dir>/<secret name>/<key>`; a standalone run points `--secrets-dir` at a folder laid
//! out the same way; the operator's probe passes values fetched from the apiserver.

use std::path::{Path, PathBuf};

use crate::api::SecretKeyRef;
use crate::api::rules;

use super::config::ConfigError;

/// The most a Secret's value can hold (the apiserver's limit for a whole Secret).
pub const MAX_SECRET_BYTES: u64 = 1024 * 1024;

/// The condition reason for a Secret value larger than its kind allows.
pub const SECRET_VALUE_TOO_LARGE: &str = "SecretValueTooLarge";

/// The most a value of the kind `field` references may hold (`field` is the reference's spec
/// path), and what that kind is: certificates and keys are PEM (a CA bundle of every public CA
/// is about 220 KiB), credentials are short. A larger value is refused before it is sent to a
/// broker or a token endpoint.
pub fn value_limit(field: &str) -> (usize, &'static str) {
    const KIB: usize = 1024;
    let key = field.rsplit('.').next().unwrap_or(field);
    match key {
        "caSecretRef" => (256 * KIB, "a CA bundle"),
        "certSecretRef" | "keySecretRef" | "pkcs12SecretRef" => (64 * KIB, "a certificate or key"),
        _ => (4 * KIB, "a user name, password or client secret"),
    }
}

/// Where a pod finds the Secrets the operator mounted for it.
pub const DEFAULT_SECRETS_DIR: &str = "/var/run/mirrorflow/secrets";

/// Refuses a Secret name or key that could leave its folder (`..`, `/`) or that Kubernetes
/// would not accept; `field` is the reference's spec path.
pub(crate) fn check_secret_ref(field: &str, secret: &SecretKeyRef) -> Result<(), ConfigError> {
    let problem = rules::secret_name_problem(&secret.name)
        .map(|m| (format!("{field}.name"), m))
        .or_else(|| rules::secret_key_problem(&secret.key).map(|m| (format!("{field}.key"), m)));
    match problem {
        Some((field, message)) => Err(ConfigError::InvalidSecretRef { field, message }),
        None => Ok(()),
    }
}

/// Reads Secret values from files laid out `<dir>/<name>/<key>` (replicator pods, standalone
/// runs), or from values already fetched from the apiserver (the operator's probe, which must not
/// write credentials to disk).
#[derive(Clone)]
pub struct SecretFiles {
    dir: PathBuf,
    values: Option<std::collections::BTreeMap<(String, String), Vec<u8>>>,
}

impl std::fmt::Debug for SecretFiles {
    // Values are credentials: never print them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretFiles")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl SecretFiles {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        SecretFiles {
            dir: dir.into(),
            values: None,
        }
    }

    /// Secret values keyed by (secret name, key).
    pub fn from_values(values: std::collections::BTreeMap<(String, String), Vec<u8>>) -> Self {
        SecretFiles {
            dir: PathBuf::from("<apiserver>"),
            values: Some(values),
        }
    }

    /// Where the Secret key's file is: `<dir>/<name>/<key>`, once the name and key are known to
    /// stay inside their folders (a flow file has no apiserver that checked them).
    pub fn path_of(&self, field: &str, secret: &SecretKeyRef) -> Result<PathBuf, ConfigError> {
        check_secret_ref(field, secret)?;
        Ok(self.dir.join(&secret.name).join(&secret.key))
    }

    /// A text value (PEM, a user name, a password): a file's trailing newline is not part of it.
    pub(crate) fn read(&self, field: &str, secret: &SecretKeyRef) -> Result<String, ConfigError> {
        let bytes = self.read_bytes(field, secret)?;
        Ok(String::from_utf8_lossy(&bytes)
            .trim_end_matches(['\n', '\r'])
            .to_string())
    }

    /// A value as it is stored (a PKCS#12 keystore is binary).
    pub(crate) fn read_bytes(
        &self,
        field: &str,
        secret: &SecretKeyRef,
    ) -> Result<Vec<u8>, ConfigError> {
        let path = self.path_of(field, secret)?;
        let unreadable = |path: PathBuf, source| ConfigError::SecretUnreadable {
            field: field.to_string(),
            secret: secret.name.clone(),
            key: secret.key.clone(),
            path,
            source,
        };
        if let Some(values) = &self.values {
            let value = values
                .get(&(secret.name.clone(), secret.key.clone()))
                .ok_or_else(|| {
                    unreadable(path, std::io::Error::from(std::io::ErrorKind::NotFound))
                })?;
            check_size(field, secret, value.len())?;
            return Ok(value.clone());
        }
        // Bounded: a Secret holds at most 1 MiB; anything larger is not one of ours.
        let meta = std::fs::metadata(&path).map_err(|e| unreadable(path.clone(), e))?;
        if meta.len() > MAX_SECRET_BYTES {
            return Err(unreadable(
                path,
                std::io::Error::other(format!("larger than {MAX_SECRET_BYTES} bytes")),
            ));
        }
        check_size(
            field,
            secret,
            usize::try_from(meta.len()).unwrap_or(usize::MAX),
        )?;
        let bytes = std::fs::read(&path).map_err(|e| unreadable(path, e))?;
        // The file may have grown since its size was read.
        check_size(field, secret, bytes.len())?;
        Ok(bytes)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Refuses a value larger than [`value_limit`] allows for `field`.
fn check_size(field: &str, secret: &SecretKeyRef, size: usize) -> Result<(), ConfigError> {
    let (max, what) = value_limit(field);
    if size <= max {
        return Ok(());
    }
    Err(ConfigError::SecretTooLarge {
        field: field.to_string(),
        secret: secret.name.clone(),
        key: secret.key.clone(),
        size,
        max,
        what,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(name: &str, key: &str) -> SecretKeyRef {
        SecretKeyRef {
            name: name.into(),
            key: key.into(),
        }
    }

    #[test]
    fn no_reference_leaves_its_secret_folder() {
        let files = SecretFiles::new("/var/run/mirrorflow/secrets");
        for (name, key, field) in [
            ("creds", "../../etc/passwd", "f.key"),
            ("creds", "..", "f.key"),
            ("creds", "a/b", "f.key"),
            ("..", "password", "f.name"),
            ("a/b", "password", "f.name"),
        ] {
            let err = files.path_of("f", &secret(name, key)).unwrap_err();
            assert!(err.to_string().starts_with(&format!("{field}: ")), "{err}");
            assert_eq!(err.reason(), "InvalidSpec");
        }
        // Values from the apiserver go through the same check, so both sources agree.
        let values = SecretFiles::from_values(
            [(("creds".into(), "..".into()), b"x".to_vec())]
                .into_iter()
                .collect(),
        );
        assert!(values.read("f", &secret("creds", "..")).is_err());
        assert_eq!(
            files.path_of("f", &secret("creds", "ca.crt")).unwrap(),
            PathBuf::from("/var/run/mirrorflow/secrets/creds/ca.crt")
        );
    }

    #[test]
    fn oversized_values_are_refused_by_kind_naming_the_secret_and_key() {
        let big = |n: usize| vec![b'x'; n];
        let values = SecretFiles::from_values(
            [
                (("creds".into(), "password".into()), big(900 * 1024)),
                (("creds".into(), "token".into()), big(4 * 1024 + 1)),
                (("creds".into(), "short".into()), big(4 * 1024)),
                (("tls".into(), "ca.crt".into()), big(220 * 1024)),
                (("tls".into(), "huge.crt".into()), big(257 * 1024)),
                (("tls".into(), "user.key".into()), big(65 * 1024)),
            ]
            .into_iter()
            .collect(),
        );
        for (field, name, key) in [
            ("spec.source.sasl.passwordSecretRef", "creds", "password"),
            (
                "spec.target.sasl.oauthbearer.clientSecretSecretRef",
                "creds",
                "token",
            ),
            ("spec.source.tls.caSecretRef", "tls", "huge.crt"),
            ("spec.source.tls.keySecretRef", "tls", "user.key"),
        ] {
            let err = values.read_bytes(field, &secret(name, key)).unwrap_err();
            assert_eq!(err.reason(), SECRET_VALUE_TOO_LARGE);
            let text = err.to_string();
            assert!(
                text.starts_with(&format!("{field}: Secret '{name}' key '{key}' holds")),
                "{text}"
            );
        }
        for (field, name, key) in [
            ("spec.source.sasl.passwordSecretRef", "creds", "short"),
            ("spec.source.tls.caSecretRef", "tls", "ca.crt"),
        ] {
            assert!(
                values.read_bytes(field, &secret(name, key)).is_ok(),
                "{key}"
            );
        }
        // Files (replicator pods, standalone runs) get the same limit.
        let dir = std::env::temp_dir().join(format!("mf-secret-size-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("creds")).unwrap();
        std::fs::write(dir.join("creds").join("password"), big(5000)).unwrap();
        let files = SecretFiles::new(&dir);
        let err = files
            .read(
                "spec.source.sasl.passwordSecretRef",
                &secret("creds", "password"),
            )
            .unwrap_err();
        assert_eq!(err.reason(), SECRET_VALUE_TOO_LARGE);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
