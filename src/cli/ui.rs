//! `waitpoint ui`: the operator page's address with a one-time login code, like a notebook
//! server's token URL. The page is served by the daemon's HTTP shim (`ingress::http::ui`); this
//! command only finds the shim where every command does (`webhook.json`, trusted while a daemon
//! holds the home) and leaves the code's hash in `ui-login.json` for it.

use std::io::Write;

use anyhow::bail;
use clap::Args;

use crate::clock::{Clock, SystemClock};
use crate::error::exit;
use crate::home::Home;
use crate::ingress::http::ui::{LOGIN_PATH, LOGIN_TTL_MS, issue_login_code};
use crate::sender::{Published, published_endpoint};

#[derive(Debug, Args)]
pub struct UiArgs {}

/// Prints the login address on stdout (and how long it lasts on stderr).
pub fn run(home: &Home, _a: UiArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    let file = home.webhook_address_file();
    let url = match published_endpoint(home) {
        Published::Up(url) => url,
        Published::Stale(why) => bail!(
            "{} is stale ({why}): the page is served by a running `waitpoint daemon --http`",
            file.display()
        ),
        Published::Absent => bail!(
            "the HTTP shim is not running for this home: the page is served by \
`waitpoint daemon --http`"
        ),
    };
    let code = issue_login_code(home, SystemClock.now())?;
    // An IPv6 literal is bracketed in a URL; webhook.json may hold it either way.
    let host = if url.host.contains(':') && !url.host.starts_with('[') {
        format!("[{}]", url.host)
    } else {
        url.host.clone()
    };
    writeln!(out, "http://{host}:{}{LOGIN_PATH}?code={code}", url.port)?;
    eprintln!(
        "waitpoint: open it within {} minutes; the code works once, and a new `waitpoint ui` \
replaces it",
        LOGIN_TTL_MS / 60_000
    );
    Ok(exit::OK)
}
