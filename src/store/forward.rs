//! A signal handed from the host that received it to the host that applies it, on a store
//! shared by several hosts: the request as the engine would see it, with the secret replaced by
//! its SHA-256, and the source it came from, so its identity is the same wherever it is applied.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clock::Timestamp;
use crate::records::SignalStatus;
use crate::request::{SignalRequest, Source, identity_key};
use crate::secret::Secret;

/// One handed-over signal (`in/<key>` on etcd, see `docs/etcd.md`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Forwarded {
    /// The signal's identity key ([`identity_key`] of its source's identity): one per signal.
    pub key: String,
    pub id: String,
    /// What the sender presented, hashed: the plaintext never leaves the receiving host.
    pub secret_sha256: String,
    pub status: SignalStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// Where it came from ([`Source::origin`]), which is its identity.
    pub source: String,
    /// The host that received it.
    pub host: String,
    pub queued_at: Timestamp,
}

impl Forwarded {
    pub fn new(req: &SignalRequest, source: &Source, host: &str, now: Timestamp) -> Forwarded {
        Forwarded {
            key: identity_key(&source.identity()),
            id: req.id.clone(),
            secret_sha256: req.secret.sha256(),
            status: req.status,
            message: req.message.clone(),
            member: req.member.clone(),
            data: req.data.clone(),
            source: source.origin(),
            host: host.to_owned(),
            queued_at: now,
        }
    }

    /// The request and source to apply, as the receiving host had them.
    pub fn request(&self) -> Option<(SignalRequest, Source)> {
        let source = Source::from_origin(&self.source)?;
        let req = SignalRequest {
            id: self.id.clone(),
            secret: Secret::from_hash(self.secret_sha256.clone()),
            status: self.status,
            message: self.message.clone(),
            member: self.member.clone(),
            data: self.data.clone(),
        };
        Some((req, source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forwarded_signal_keeps_its_identity_and_verifies_without_its_plaintext() {
        let req = SignalRequest {
            id: "wp_0123456789ab".into(),
            secret: Secret::new("s3cret"),
            status: SignalStatus::Ok,
            message: Some("done".into()),
            member: None,
            data: None,
        };
        for source in [
            Source::Spool("cs-0123456789abcdef0123456789abcdef.json".into()),
            Source::Http("my-key".into()),
            Source::Device {
                device: "gpu1".into(),
                file: "a.json".into(),
            },
        ] {
            let f = Forwarded::new(&req, &source, "host-a", Timestamp::from_millis(1));
            let text = serde_json::to_string(&f).unwrap();
            assert!(!text.contains("s3cret"), "{text}");
            let back: Forwarded = serde_json::from_str(&text).unwrap();
            let (r, s) = back.request().unwrap();
            assert_eq!(s, source);
            assert_eq!(s.identity(), source.identity());
            assert!(r.secret.verify(&crate::secret::hash("s3cret")));
            assert!(!r.secret.verify(&crate::secret::hash("other")));
        }
    }
}
