//! The client side of SCRAM (RFC 5802, with SHA-256 or SHA-512 as Kafka offers them): three
//! messages, and the server's signature checked, so a broker that does not know the password
//! cannot pass for one that does.

use openssl::hash::{Hasher, MessageDigest};
use openssl::pkey::PKey;
use openssl::sign::Signer;

use crate::ConnError;

/// SCRAM's hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScramHash {
    Sha256,
    Sha512,
}

impl ScramHash {
    /// The SASL mechanism's name.
    pub fn mechanism(self) -> &'static str {
        match self {
            ScramHash::Sha256 => "SCRAM-SHA-256",
            ScramHash::Sha512 => "SCRAM-SHA-512",
        }
    }

    fn digest(self) -> MessageDigest {
        match self {
            ScramHash::Sha256 => MessageDigest::sha256(),
            ScramHash::Sha512 => MessageDigest::sha512(),
        }
    }
}

/// Iteration counts below this are refused: RFC 7677 asks for at least 4096, and a broker
/// offering fewer makes the password cheap to guess from what it stores.
const MIN_ITERATIONS: u32 = 4096;
/// And above this: a broker could otherwise keep the client hashing for minutes.
const MAX_ITERATIONS: u32 = 1 << 20;

/// One exchange, from the client's first message to the check of the server's last.
pub struct Scram {
    hash: ScramHash,
    password: String,
    client_first_bare: String,
    client_nonce: String,
    /// The server's expected signature, once the client's proof is sent.
    server_signature: Option<Vec<u8>>,
}

fn error(message: impl Into<String>) -> ConnError {
    ConnError::Authentication {
        message: message.into(),
    }
}

/// A username as SCRAM writes it: `=` and `,` escaped.
fn saslname(user: &str) -> String {
    user.replace('=', "=3D").replace(',', "=2C")
}

impl Scram {
    /// Starts an exchange with `client_nonce` (printable, without commas: [`Self::nonce`]).
    pub fn new(hash: ScramHash, user: &str, password: &str, client_nonce: String) -> Self {
        let client_first_bare = format!("n={},r={client_nonce}", saslname(user));
        Self {
            hash,
            password: password.to_owned(),
            client_first_bare,
            client_nonce,
            server_signature: None,
        }
    }

    /// A fresh random nonce.
    pub fn nonce() -> Result<String, ConnError> {
        let mut raw = [0u8; 24];
        openssl::rand::rand_bytes(&mut raw).map_err(|e| error(format!("random nonce: {e}")))?;
        Ok(openssl::base64::encode_block(&raw))
    }

    /// The client's first message: no channel binding, the user, the nonce.
    pub fn client_first(&self) -> String {
        format!("n,,{}", self.client_first_bare)
    }

    /// The client's final message (with its proof) in answer to the server's first.
    pub fn client_final(&mut self, server_first: &[u8]) -> Result<String, ConnError> {
        let server_first = std::str::from_utf8(server_first)
            .map_err(|_| error("the broker's first SCRAM message is not UTF-8"))?;
        let (mut nonce, mut salt, mut iterations) = (None, None, None);
        for attribute in server_first.split(',') {
            match attribute.split_once('=') {
                Some(("r", v)) => nonce = Some(v),
                Some(("s", v)) => salt = Some(v),
                Some(("i", v)) => iterations = Some(v),
                Some(("m", _)) => return Err(error("the broker asks for a SCRAM extension")),
                _ => {}
            }
        }
        let (Some(nonce), Some(salt), Some(iterations)) = (nonce, salt, iterations) else {
            return Err(error(
                "the broker's first SCRAM message lacks its nonce, salt or iteration count",
            ));
        };
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err(error(
                "the broker's SCRAM nonce does not extend the client's",
            ));
        }
        let salt = openssl::base64::decode_block(salt)
            .map_err(|_| error("the broker's SCRAM salt is not base64"))?;
        let iterations: u32 = iterations
            .parse()
            .map_err(|_| error("the broker's SCRAM iteration count is not a number"))?;
        if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
            return Err(error(format!(
                "the broker asks for {iterations} SCRAM iterations, outside {MIN_ITERATIONS}..={MAX_ITERATIONS}"
            )));
        }
        let digest = self.hash.digest();
        let mut salted = vec![0u8; digest.size()];
        openssl::pkcs5::pbkdf2_hmac(
            self.password.as_bytes(),
            &salt,
            usize::try_from(iterations).unwrap_or(usize::MAX),
            digest,
            &mut salted,
        )
        .map_err(|e| error(format!("PBKDF2: {e}")))?;
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let client_key = self.hmac(&salted, b"Client Key")?;
        let stored_key = self.hash(&client_key)?;
        let signature = self.hmac(&stored_key, auth_message.as_bytes())?;
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(k, s)| k ^ s)
            .collect();
        let server_key = self.hmac(&salted, b"Server Key")?;
        self.server_signature = Some(self.hmac(&server_key, auth_message.as_bytes())?);
        Ok(format!(
            "{without_proof},p={}",
            openssl::base64::encode_block(&proof)
        ))
    }

    /// Checks the server's final message: its signature proves it knows the password.
    pub fn verify_server_final(&self, server_final: &[u8]) -> Result<(), ConnError> {
        let server_final = std::str::from_utf8(server_final)
            .map_err(|_| error("the broker's final SCRAM message is not UTF-8"))?;
        if let Some(e) = server_final.strip_prefix("e=") {
            return Err(error(format!("the broker refused the SCRAM proof: {e}")));
        }
        let Some(v) = server_final.split(',').find_map(|a| a.strip_prefix("v=")) else {
            return Err(error("the broker's final SCRAM message has no signature"));
        };
        let got = openssl::base64::decode_block(v)
            .map_err(|_| error("the broker's SCRAM signature is not base64"))?;
        match &self.server_signature {
            Some(expected)
                if expected.len() == got.len() && openssl::memcmp::eq(expected, &got) =>
            {
                Ok(())
            }
            Some(_) => Err(error(
                "the broker's SCRAM signature is wrong: it does not know the password",
            )),
            None => Err(error(
                "the broker's final SCRAM message came before the proof",
            )),
        }
    }

    fn hmac(&self, key: &[u8], data: &[u8]) -> Result<Vec<u8>, ConnError> {
        let key = PKey::hmac(key).map_err(|e| error(format!("HMAC key: {e}")))?;
        let mut signer =
            Signer::new(self.hash.digest(), &key).map_err(|e| error(format!("HMAC: {e}")))?;
        signer
            .update(data)
            .and_then(|()| signer.sign_to_vec())
            .map_err(|e| error(format!("HMAC: {e}")))
    }

    fn hash(&self, data: &[u8]) -> Result<Vec<u8>, ConnError> {
        let mut h = Hasher::new(self.hash.digest()).map_err(|e| error(format!("hash: {e}")))?;
        h.update(data)
            .and_then(|()| h.finish())
            .map(|d| d.to_vec())
            .map_err(|e| error(format!("hash: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677 section 3's example exchange.
    #[test]
    fn the_rfc_7677_exchange() {
        let mut scram = Scram::new(
            ScramHash::Sha256,
            "user",
            "pencil",
            "rOprNGfwEbeRWgbNEkqO".to_owned(),
        );
        assert_eq!(scram.client_first(), "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        assert_eq!(
            scram
                .client_final(server_first)
                .expect("a valid first message"),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        assert!(
            scram
                .verify_server_final(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
                .is_ok()
        );
        assert!(
            scram
                .verify_server_final(b"v=7rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
                .is_err(),
            "a wrong signature is refused"
        );
        assert!(scram.verify_server_final(b"e=invalid-proof").is_err());
    }

    #[test]
    fn usernames_are_escaped() {
        let scram = Scram::new(ScramHash::Sha512, "a=b,c", "p", "n".to_owned());
        assert_eq!(scram.client_first(), "n,,n=a=3Db=2Cc,r=n");
    }

    #[test]
    fn a_broker_first_message_that_cannot_be_trusted_is_refused() {
        let cases: [&[u8]; 6] = [
            b"r=other,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
            b"r=abc,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
            b"r=abcdef,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=1",
            b"r=abcdef,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4000000000",
            b"r=abcdef,s=***,i=4096",
            b"r=abcdef,i=4096",
        ];
        for server_first in cases {
            let mut scram = Scram::new(ScramHash::Sha256, "u", "p", "abc".to_owned());
            assert!(
                scram.client_final(server_first).is_err(),
                "{}",
                String::from_utf8_lossy(server_first)
            );
        }
        let scram = Scram::new(ScramHash::Sha256, "u", "p", "abc".to_owned());
        assert!(
            scram.verify_server_final(b"v=AAAA").is_err(),
            "no proof sent yet"
        );
    }
}
