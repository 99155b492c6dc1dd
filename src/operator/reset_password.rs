//! `aigw admin reset-password EMAIL`: sets a member's password on the host, against the
//! configured database, for an owner who lost theirs (DESIGN.md §11). The new password comes from
//! standard input or a prompt, never from the command line (where `ps` shows it), or is
//! generated and printed once. The member's sessions end, on every gateway, and the audit log
//! records the reset.

use super::{database_name, open_existing};
use crate::config::Settings;
use crate::store::{AdminStore, AuditEntry, MemberStore};

/// Where the new password comes from.
pub enum NewPassword {
    /// Given by the operator (read from standard input or a prompt).
    Given(String),
    /// Generated here, and returned to be printed once.
    Generate,
}

/// Who the audit log names for a reset made on the host (there is no signed-in member).
pub const AUDIT_ACTOR: &str = "aigw admin reset-password (on the host)";

/// Sets `email`'s password and ends its sessions. Returns the generated password, if one was
/// generated. Nothing is written when the member, the database or the password is wrong.
pub async fn reset_password(
    settings: &Settings,
    email: &str,
    new: NewPassword,
    now_ms: i64,
) -> Result<Option<String>, String> {
    let (password, generated) = match new {
        NewPassword::Given(p) => {
            crate::validate::password("the new password", &p)?;
            (p, false)
        }
        NewPassword::Generate => (crate::kernel::crypto::generate_password(), true),
    };
    let name = database_name(settings);
    let store = open_existing(settings)
        .await
        .map_err(|e| format!("cannot open the database: {e}"))?
        .ok_or_else(|| {
            format!(
                "there is no database at {name}: run this with the settings of the gateway \
                 (--config, AIGW_DATABASE_URL), in its working folder"
            )
        })?;
    let result = async {
        let pending = store.migrations_pending().await.map_err(|e| e.to_string())?;
        if pending > 0 {
            return Err(format!(
                "the database {name} lacks {pending} migrations of this aigw: use the aigw \
                 version that runs on it, or start this one once"
            ));
        }
        let member = store
            .member_by_email(email)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no member has the email {email:?} in the database {name}"))?;
        let hash = crate::kernel::crypto::hash_password(&password);
        store
            .set_member_password(member.id, &hash)
            .await
            .map_err(|e| e.to_string())?;
        // Every gateway checks a token's session epoch against the member's on each admin
        // request: the member's open sessions end everywhere.
        store
            .bump_session_epoch(member.id)
            .await
            .map_err(|e| e.to_string())?;
        store
            .audit(&AuditEntry {
                workspace_id: member.workspace_id,
                client_ip: "host",
                at: now_ms,
                actor_id: 0,
                actor_email: AUDIT_ACTOR,
                actor_token: None,
                action: "reset_password",
                target_kind: "member",
                target_id: member.id,
                before: None,
                after: None,
            })
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }
    .await;
    store.close().await;
    result.map(|()| generated.then_some(password))
}

/// Reads a line from the terminal on standard input without echoing it, after `prompt` on
/// standard error. `None` when standard input is not a terminal.
pub fn read_hidden_line(prompt: &str) -> Option<std::io::Result<String>> {
    use std::io::{IsTerminal, Write};
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return None;
    }
    eprint!("{prompt}");
    let _ = std::io::stderr().flush();
    let echo = EchoOff::new();
    let mut line = String::new();
    let read = stdin.read_line(&mut line);
    drop(echo);
    eprintln!();
    Some(read.map(|_| line.trim_end_matches(['\n', '\r']).to_owned()))
}

/// Turns the terminal's echo off until dropped.
struct EchoOff(Option<libc::termios>);

impl EchoOff {
    fn new() -> EchoOff {
        // SAFETY: tcgetattr and tcsetattr read and write a termios struct we own, for fd 0.
        unsafe {
            let mut term: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut term) != 0 {
                return EchoOff(None);
            }
            let saved = term;
            term.c_lflag &= !libc::ECHO;
            if libc::tcsetattr(0, libc::TCSANOW, &term) != 0 {
                return EchoOff(None);
            }
            EchoOff(Some(saved))
        }
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            // SAFETY: restores the settings read in `new`, for fd 0.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, saved) };
        }
    }
}
