//! Where waitpoints live, as a user names it: `files` (the home, the default) or
//! `etcd://host:port,host:port/prefix` (an etcd cluster shared by several hosts; `etcds://` for
//! TLS). Parsed here in every build, so a build without the `etcd` feature can say so plainly.
//!
//! Credentials never go in the URL, which shows in argv, `ps` and logs: the user name, the file
//! holding the password and the TLS files are keys of settings.json (`store` as an object),
//! whose permissions the settings loader checks.

use std::path::PathBuf;

/// The default lease of a daemon's leadership, in seconds: a dead leader is replaced about
/// this long after it stopped renewing.
pub const DEFAULT_LEASE_TTL_S: u64 = 5;
/// The key prefix every waitpoint key sits under when the URL names none.
pub const DEFAULT_PREFIX: &str = "waitpoint/";

/// Where waitpoints live.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Location {
    /// The home's files (`store::Files`).
    #[default]
    Files,
    /// An etcd cluster (`store::etcd`, built with the `etcd` feature).
    Etcd(Box<EtcdLocation>),
}

/// An etcd cluster and how to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdLocation {
    /// `http://host:port` (or `https://`) for each member given.
    pub endpoints: Vec<String>,
    /// Every key sits under it (ends in `/`).
    pub prefix: String,
    pub tls: bool,
    pub user: Option<String>,
    /// A file holding the user's password (its first line).
    pub password_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// The name the members' certificates carry, when the endpoints are addresses.
    pub tls_domain: Option<String>,
    /// The leadership lease, in seconds.
    pub lease_ttl_s: u64,
}

impl EtcdLocation {
    /// The URL without anything secret, for messages and logs.
    pub fn display(&self) -> String {
        let scheme = if self.tls { "etcds" } else { "etcd" };
        let hosts: Vec<&str> = self
            .endpoints
            .iter()
            .map(|e| e.split_once("://").map_or(e.as_str(), |(_, h)| h))
            .collect();
        format!("{scheme}://{}/{}", hosts.join(","), self.prefix)
    }
}

impl Location {
    /// Parses `files`, `etcd://h1:2379,h2:2379[/prefix]` or `etcds://…`.
    pub fn parse(url: &str) -> Result<Location, String> {
        let url = url.trim();
        if url.is_empty() || url == "files" {
            return Ok(Location::Files);
        }
        let (tls, rest) = if let Some(r) = url.strip_prefix("etcd://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("etcds://") {
            (true, r)
        } else {
            return Err(format!(
                "store {url:?} is neither `files` nor `etcd://host:port[,host:port…][/prefix]`"
            ));
        };
        let (hosts, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if hosts.contains('@') {
            return Err(
                "store URL must not carry credentials (argv and logs show it): set \
                        `store.user` and `store.passwordFile` in settings.json"
                    .into(),
            );
        }
        let mut endpoints = Vec::new();
        for h in hosts.split(',').map(str::trim).filter(|h| !h.is_empty()) {
            let (name, port) = h
                .rsplit_once(':')
                .ok_or_else(|| format!("store member {h:?} has no port (host:2379)"))?;
            if name.is_empty() || port.parse::<u16>().is_err() {
                return Err(format!("store member {h:?} is not host:port"));
            }
            endpoints.push(format!("{}://{h}", if tls { "https" } else { "http" }));
        }
        if endpoints.is_empty() {
            return Err(format!("store {url:?} names no member (etcd://host:port)"));
        }
        let prefix = match prefix.trim_matches('/') {
            "" => DEFAULT_PREFIX.to_owned(),
            p if p
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c)) =>
            {
                format!("{p}/")
            }
            p => {
                return Err(format!(
                    "store prefix {p:?} may hold only letters, digits, - _ . /"
                ));
            }
        };
        Ok(Location::Etcd(Box::new(EtcdLocation {
            endpoints,
            prefix,
            tls,
            user: None,
            password_file: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
            tls_domain: None,
            lease_ttl_s: DEFAULT_LEASE_TTL_S,
        })))
    }

    /// The settings key `store`: a URL, or an object with `url` and the keys of how to reach
    /// it (`user`, `passwordFile`, `caFile`, `certFile`, `keyFile`, `tlsDomain`, `leaseTtlS`).
    pub fn from_setting(value: &serde_json::Value) -> Result<Location, String> {
        use serde_json::Value;
        let obj = match value {
            Value::String(url) => return Location::parse(url),
            Value::Object(o) => o,
            other => {
                return Err(format!(
                    "key `store` must be a URL or an object with `url`, not {other}"
                ));
            }
        };
        let url = obj
            .get("url")
            .and_then(Value::as_str)
            .ok_or("key `store.url` must be a string such as \"etcd://127.0.0.1:2379\"")?;
        let mut loc = Location::parse(url)?;
        let Location::Etcd(e) = &mut loc else {
            return Ok(loc);
        };
        let text = |k: &str| -> Result<Option<String>, String> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
                Some(v) => Err(format!(
                    "key `store.{k}` must be a non-empty string, not {v}"
                )),
            }
        };
        let path = |k: &str| text(k).map(|t| t.map(PathBuf::from));
        e.user = text("user")?;
        e.password_file = path("passwordFile")?;
        e.ca_file = path("caFile")?;
        e.cert_file = path("certFile")?;
        e.key_file = path("keyFile")?;
        e.tls_domain = text("tlsDomain")?;
        if let Some(v) = obj.get("leaseTtlS") {
            e.lease_ttl_s = v
                .as_u64()
                .filter(|n| (1..=600).contains(n))
                .ok_or_else(|| format!("key `store.leaseTtlS` must be 1 to 600, not {v}"))?;
        }
        if e.user.is_some() != e.password_file.is_some() {
            return Err("keys `store.user` and `store.passwordFile` go together".into());
        }
        if e.cert_file.is_some() != e.key_file.is_some() {
            return Err("keys `store.certFile` and `store.keyFile` go together".into());
        }
        Ok(loc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_parse_into_members_and_a_prefix() {
        assert_eq!(Location::parse("files"), Ok(Location::Files));
        let Ok(Location::Etcd(e)) = Location::parse("etcd://127.0.0.1:2379,h2:2380/team/a") else {
            panic!()
        };
        assert_eq!(e.endpoints, ["http://127.0.0.1:2379", "http://h2:2380"]);
        assert_eq!(e.prefix, "team/a/");
        assert_eq!(e.display(), "etcd://127.0.0.1:2379,h2:2380/team/a/");
        let Ok(Location::Etcd(e)) = Location::parse("etcds://h:1") else {
            panic!()
        };
        assert_eq!((e.tls, e.prefix.as_str()), (true, DEFAULT_PREFIX));
    }

    #[test]
    fn a_store_url_with_credentials_or_without_a_port_is_refused() {
        let err = Location::parse("etcd://root:pw@h:2379").unwrap_err();
        assert!(
            err.contains("passwordFile") && !err.contains("pw@"),
            "{err}"
        );
        assert!(Location::parse("etcd://h").is_err());
        assert!(Location::parse("etcd://").is_err());
        assert!(Location::parse("redis://h:1").is_err());
    }

    #[test]
    fn the_store_setting_takes_credentials_as_files() {
        let v = serde_json::json!({"url": "etcd://h:2379", "user": "wp",
            "passwordFile": "/etc/wp/pw", "leaseTtlS": 3});
        let Ok(Location::Etcd(e)) = Location::from_setting(&v) else {
            panic!()
        };
        assert_eq!(e.user.as_deref(), Some("wp"));
        assert_eq!(e.password_file, Some(PathBuf::from("/etc/wp/pw")));
        assert_eq!(e.lease_ttl_s, 3);
        let v = serde_json::json!({"url": "etcd://h:2379", "user": "wp"});
        assert!(Location::from_setting(&v).is_err());
    }
}
