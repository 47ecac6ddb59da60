//! The world's OAUTHBEARER listeners and its OAuth token endpoint (`e2e/lib/oidc.sh`): where
//! they are, and clients a test registers for itself so its token counts are its own.

use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::{Context, Result};

pub struct OAuthKafka {
    /// `host:port` of the source and target clusters' OAUTHBEARER (SASL_PLAINTEXT) listeners.
    pub source_bootstrap: String,
    pub target_bootstrap: String,
    /// `http://127.0.0.1:PORT`: `/token`, `/jwks`, `/issued`.
    pub url: String,
    clients_file: PathBuf,
}

/// Tests of one binary run in parallel threads; clients.json is rewritten whole.
static CLIENTS: Mutex<()> = Mutex::new(());

impl OAuthKafka {
    pub fn from_env() -> Result<OAuthKafka> {
        let var = |n: &str| {
            std::env::var(n).with_context(|| {
                format!("{n} is not set: run the tests through e2e/test.sh, which starts the world")
            })
        };
        Ok(OAuthKafka {
            source_bootstrap: var("MF_SOURCE_OAUTH_BOOTSTRAP")?,
            target_bootstrap: var("MF_TARGET_OAUTH_BOOTSTRAP")?,
            url: var("MF_OIDC_URL")?,
            clients_file: PathBuf::from(var("MF_OIDC_CLIENTS_FILE")?),
        })
    }

    pub fn token_url(&self) -> String {
        format!("{}/token", self.url)
    }

    /// Registers a client with the token endpoint (it reads the file on every request).
    /// `audience`: the `aud` its tokens carry instead of the brokers' expected one.
    pub fn add_client(&self, id: &str, secret: &str, audience: Option<&str>) -> Result<()> {
        let _one_writer = CLIENTS.lock().unwrap_or_else(|e| e.into_inner());
        let text = std::fs::read_to_string(&self.clients_file)
            .with_context(|| format!("reading {}", self.clients_file.display()))?;
        let mut clients: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text)?;
        let mut client = serde_json::json!({"secret": secret, "scopes": ["kafka"]});
        if let Some(aud) = audience {
            client["audience"] = aud.into();
        }
        clients.insert(id.to_string(), client);
        let tmp = self.clients_file.with_extension(format!("{id}.tmp"));
        std::fs::write(&tmp, serde_json::to_vec(&clients)?)?;
        std::fs::rename(&tmp, &self.clients_file)?;
        Ok(())
    }

    /// How many tokens the endpoint issued to `client_id` so far.
    pub fn issued(&self, client_id: &str) -> Result<u64> {
        let addr = self.url.trim_start_matches("http://");
        let body = crate::replicator::http_get(addr, "/issued")?;
        let counts: serde_json::Value = serde_json::from_str(&body)?;
        Ok(counts.get(client_id).and_then(|v| v.as_u64()).unwrap_or(0))
    }
}
