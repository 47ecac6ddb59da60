//! Secret values for client configurations. The operator mounts each Secret at
//! `<secrets dir>/<secret name>/<key>`; a standalone run points `--secrets-dir` at a folder laid
//! out the same way; the operator's probe passes values fetched from the apiserver.

use std::path::{Path, PathBuf};

use crate::api::SecretKeyRef;
use crate::api::rules;

use super::config::ConfigError;

/// The most a Secret's value can hold (the apiserver's limit for a whole Secret).
pub const MAX_SECRET_BYTES: u64 = 1024 * 1024;

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
            return values
                .get(&(secret.name.clone(), secret.key.clone()))
                .cloned()
                .ok_or_else(|| {
                    unreadable(path, std::io::Error::from(std::io::ErrorKind::NotFound))
                });
        }
        // Bounded: a Secret holds at most 1 MiB; anything larger is not one of ours.
        let meta = std::fs::metadata(&path).map_err(|e| unreadable(path.clone(), e))?;
        if meta.len() > MAX_SECRET_BYTES {
            return Err(unreadable(
                path,
                std::io::Error::other(format!("larger than {MAX_SECRET_BYTES} bytes")),
            ));
        }
        std::fs::read(&path).map_err(|e| unreadable(path, e))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
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
}
