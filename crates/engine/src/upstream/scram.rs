//! Logging in to the upstream as a client's role without its password: SCRAM-SHA-256 with the
//! role's keys (RFC 5802's `ClientKey` and `ServerKey`) in place of the password they derive
//! from. sluice learns a role's `ClientKey` from the client's own SCRAM proof, checked against
//! the role's verifier (PgBouncer's `auth_query` way); the upstream then sees the same proof a
//! client knowing the password would send, and sluice checks the upstream's signature with the
//! `ServerKey`, so neither side ever holds the password.
//!
//! Invariant: the keys are never shown (their `Debug` hides them) and never logged.

use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ring::digest;
use ring::hmac;

/// A role's SCRAM-SHA-256 keys: what a client's proof reveals to a server that holds the
/// role's verifier. Enough to log in as the role where that verifier is the role's password.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ScramKeys {
    pub client_key: [u8; 32],
    pub server_key: [u8; 32],
}

impl fmt::Debug for ScramKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ScramKeys(..)")
    }
}

fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), message);
    let mut out = [0u8; 32];
    out.copy_from_slice(tag.as_ref());
    out
}

fn sha256(data: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest::digest(&digest::SHA256, data).as_ref());
    out
}

impl ScramKeys {
    /// The keys a client's proof reveals: `ClientKey = ClientProof XOR HMAC(StoredKey,
    /// AuthMessage)`, checked by `H(ClientKey) = StoredKey`. `None` when the proof is not
    /// the verifier's (the password was wrong).
    pub fn from_proof(
        stored_key: &[u8],
        server_key: &[u8],
        auth_message: &[u8],
        proof: &[u8],
    ) -> Option<ScramKeys> {
        if proof.len() != 32 || stored_key.len() != 32 || server_key.len() != 32 {
            return None;
        }
        let signature = hmac_sha256(stored_key, auth_message);
        let mut client_key = [0u8; 32];
        for (i, byte) in client_key.iter_mut().enumerate() {
            *byte = proof[i] ^ signature[i];
        }
        if sha256(&client_key).as_slice() != stored_key {
            return None;
        }
        let mut keys = ScramKeys {
            client_key,
            server_key: [0u8; 32],
        };
        keys.server_key.copy_from_slice(server_key);
        Some(keys)
    }
}

/// sluice's side of one SCRAM-SHA-256 exchange with the upstream, made with [`ScramKeys`].
#[derive(Debug)]
pub struct KeyedScram {
    keys: ScramKeys,
    client_first_bare: String,
    /// What to send next.
    message: Vec<u8>,
    auth_message: Option<String>,
}

impl KeyedScram {
    /// The client-first message (no channel binding: `n,,`; the user is in the start-up
    /// packet, as libpq leaves it).
    pub fn new(keys: ScramKeys) -> KeyedScram {
        use ring::rand::SecureRandom;
        let mut raw = [0u8; 18];
        // Without randomness the nonce is still unique enough to fail safe: the upstream
        // adds its own.
        let _ = ring::rand::SystemRandom::new().fill(&mut raw);
        let client_first_bare = format!("n=,r={}", STANDARD.encode(raw));
        KeyedScram {
            keys,
            message: format!("n,,{client_first_bare}").into_bytes(),
            client_first_bare,
            auth_message: None,
        }
    }

    /// The message to send now.
    pub fn message(&self) -> &[u8] {
        &self.message
    }

    /// Reads the server-first message and makes the client-final one (with the proof).
    pub fn update(&mut self, server_first: &[u8]) -> Result<(), String> {
        let server_first =
            std::str::from_utf8(server_first).map_err(|_| "server-first is not UTF-8")?;
        let nonce = server_first
            .split(',')
            .find_map(|a| a.strip_prefix("r="))
            .ok_or("server-first has no nonce")?;
        let ours = self
            .client_first_bare
            .strip_prefix("n=,r=")
            .unwrap_or_default();
        if !nonce.starts_with(ours) || nonce.len() <= ours.len() {
            return Err("the server's nonce does not extend ours".into());
        }
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let stored_key = sha256(&self.keys.client_key);
        let signature = hmac_sha256(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = self
            .keys
            .client_key
            .iter()
            .zip(signature)
            .map(|(k, s)| k ^ s)
            .collect();
        self.message = format!("{without_proof},p={}", STANDARD.encode(proof)).into_bytes();
        self.auth_message = Some(auth_message);
        Ok(())
    }

    /// Checks the server-final message: the upstream proves it holds the role's verifier.
    pub fn finish(&self, server_final: &[u8]) -> Result<(), String> {
        let auth_message = self.auth_message.as_ref().ok_or("server-final too early")?;
        let server_final =
            std::str::from_utf8(server_final).map_err(|_| "server-final is not UTF-8")?;
        if let Some(error) = server_final.strip_prefix("e=") {
            return Err(error.to_string());
        }
        let given = server_final
            .strip_prefix("v=")
            .and_then(|v| STANDARD.decode(v).ok())
            .ok_or("server-final has no signature")?;
        let expected = hmac_sha256(&self.keys.server_key, auth_message.as_bytes());
        // Public once sent: no need for a comparison in constant time.
        if given.as_slice() != expected.as_slice() {
            return Err("the server's signature does not match".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys of a password, as PostgreSQL derives them (`Hi` is PBKDF2-HMAC-SHA256).
    fn keys_of(password: &str, salt: &[u8], iterations: u32) -> ScramKeys {
        let mut salted = [0u8; 32];
        ring::pbkdf2::derive(
            ring::pbkdf2::PBKDF2_HMAC_SHA256,
            std::num::NonZeroU32::new(iterations).expect("iterations"),
            salt,
            password.as_bytes(),
            &mut salted,
        );
        ScramKeys {
            client_key: hmac_sha256(&salted, b"Client Key"),
            server_key: hmac_sha256(&salted, b"Server Key"),
        }
    }

    #[test]
    fn a_proof_made_with_keys_reveals_the_same_keys_and_a_wrong_one_nothing() {
        let keys = keys_of("pencil", b"salt-of-sixteen!", 4096);
        let stored_key = sha256(&keys.client_key);
        let mut client = KeyedScram::new(keys.clone());
        let first = String::from_utf8(client.message().to_vec()).expect("utf-8");
        let nonce = first.strip_prefix("n,,n=,r=").expect("client-first");
        let server_first = format!("r={nonce}SERVER,s=c2FsdA==,i=4096");
        client
            .update(server_first.as_bytes())
            .expect("server-first");
        let last = String::from_utf8(client.message().to_vec()).expect("utf-8");
        let (without_proof, proof) = last.split_once(",p=").expect("proof");
        let auth_message = format!("n=,r={nonce},{server_first},{without_proof}");
        let proof = STANDARD.decode(proof).expect("base64");
        let revealed = ScramKeys::from_proof(
            &stored_key,
            &keys.server_key,
            auth_message.as_bytes(),
            &proof,
        )
        .expect("the proof is the verifier's");
        assert_eq!(revealed, keys);
        let other = keys_of("pen", b"salt-of-sixteen!", 4096);
        assert!(ScramKeys::from_proof(
            &sha256(&other.client_key),
            &other.server_key,
            auth_message.as_bytes(),
            &proof
        )
        .is_none());
        // The server proves itself with the ServerKey.
        let signature = hmac_sha256(&keys.server_key, auth_message.as_bytes());
        client
            .finish(format!("v={}", STANDARD.encode(signature)).as_bytes())
            .expect("signature");
        assert!(client.finish(b"v=AAAA").is_err());
        assert!(client.finish(b"e=invalid-proof").is_err());
        assert!(format!("{keys:?}") == "ScramKeys(..)");
    }

    #[test]
    fn a_server_nonce_that_does_not_extend_ours_is_refused() {
        let mut client = KeyedScram::new(keys_of("x", b"s", 4096));
        assert!(client.update(b"r=other,s=c2FsdA==,i=4096").is_err());
    }
}
