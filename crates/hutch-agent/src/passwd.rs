//! Users and groups from the sandbox's own `/etc/passwd` and `/etc/group`.
//!
//! The agent is a static binary, so it cannot use NSS (`getpwnam`); it parses the files
//! itself. A user is named or given as a numeric uid. A numeric uid with no entry runs with
//! gid = uid, home `/` and no supplementary groups. `root` works even without the files.

/// A resolved account to run a process as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Login name (the numeric uid as text when the uid has no entry).
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Primary and supplementary group ids, without duplicates.
    pub groups: Vec<u32>,
    /// Home directory.
    pub home: String,
}

/// Why a user could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PasswdError {
    /// No such user name.
    #[error("unknown user {0:?} (not in /etc/passwd)")]
    UnknownUser(String),
    /// An empty user string.
    #[error("user must not be empty")]
    Empty,
}

struct PasswdEntry<'a> {
    name: &'a str,
    uid: u32,
    gid: u32,
    home: &'a str,
}

fn passwd_entries(text: &str) -> impl Iterator<Item = PasswdEntry<'_>> {
    text.lines().filter_map(|line| {
        let line = line.trim_end();
        if line.starts_with('#') {
            return None;
        }
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() < 7 || fields[0].is_empty() {
            return None;
        }
        Some(PasswdEntry {
            name: fields[0],
            uid: fields[2].parse().ok()?,
            gid: fields[3].parse().ok()?,
            home: fields[5],
        })
    })
}

/// `(name, gid, members)` of every well-formed line of `/etc/group`.
fn named_group_entries(text: &str) -> impl Iterator<Item = (&str, u32, Vec<&str>)> {
    text.lines().filter_map(|line| {
        let line = line.trim_end();
        if line.starts_with('#') {
            return None;
        }
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() < 4 || fields[0].is_empty() {
            return None;
        }
        let gid = fields[2].parse().ok()?;
        let members = fields[3].split(',').filter(|m| !m.is_empty()).collect();
        Some((fields[0], gid, members))
    })
}

/// Names of user and group ids, for file entries (`owner`, `group`).
#[derive(Debug, Clone, Default)]
pub struct Owners {
    users: std::collections::HashMap<u32, String>,
    groups: std::collections::HashMap<u32, String>,
}

impl Owners {
    /// The names in the contents of `/etc/passwd` and `/etc/group` (the first line of an id
    /// wins).
    pub fn parse(passwd: &str, group: &str) -> Self {
        let mut owners = Self::default();
        for e in passwd_entries(passwd) {
            owners
                .users
                .entry(e.uid)
                .or_insert_with(|| e.name.to_string());
        }
        for (name, gid, _) in named_group_entries(group) {
            owners.groups.entry(gid).or_insert_with(|| name.to_string());
        }
        owners
    }

    /// The names in the sandbox's own `/etc/passwd` and `/etc/group` (none when missing).
    /// Blocking.
    pub fn load() -> Self {
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
        Self::parse(&passwd, &group)
    }

    /// The name of user `uid`, if it has one.
    pub fn user(&self, uid: u32) -> Option<&str> {
        self.users.get(&uid).map(String::as_str)
    }

    /// The name of group `gid`, if it has one.
    pub fn group(&self, gid: u32) -> Option<&str> {
        self.groups.get(&gid).map(String::as_str)
    }
}

/// `(gid, members)` of every well-formed line of `/etc/group`.
fn group_entries(text: &str) -> impl Iterator<Item = (u32, Vec<&str>)> {
    text.lines().filter_map(|line| {
        let line = line.trim_end();
        if line.starts_with('#') {
            return None;
        }
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() < 4 {
            return None;
        }
        let gid = fields[2].parse().ok()?;
        let members = fields[3].split(',').filter(|m| !m.is_empty()).collect();
        Some((gid, members))
    })
}

/// Resolve `user` (a name or a numeric uid) against the contents of `/etc/passwd` and
/// `/etc/group` (empty strings when the files are missing).
pub fn resolve(user: &str, passwd: &str, group: &str) -> Result<Account, PasswdError> {
    if user.is_empty() {
        return Err(PasswdError::Empty);
    }
    let numeric: Option<u32> = user.parse().ok();
    let entry = passwd_entries(passwd)
        .find(|e| e.name == user)
        .or_else(|| numeric.and_then(|uid| passwd_entries(passwd).find(|e| e.uid == uid)));
    let (name, uid, gid, home) = match (entry, numeric) {
        (Some(e), _) => (e.name.to_string(), e.uid, e.gid, e.home.to_string()),
        (None, _) if user == "root" => ("root".to_string(), 0, 0, "/root".to_string()),
        (None, Some(uid)) => (user.to_string(), uid, uid, "/".to_string()),
        (None, None) => return Err(PasswdError::UnknownUser(user.to_string())),
    };
    let mut groups = vec![gid];
    for (group_id, members) in group_entries(group) {
        if members.contains(&name.as_str()) && !groups.contains(&group_id) {
            groups.push(group_id);
        }
    }
    let home = if home.is_empty() {
        "/".to_string()
    } else {
        home
    };
    Ok(Account {
        name,
        uid,
        gid,
        groups,
        home,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "\
root:x:0:0:root:/root:/bin/bash
# a comment
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
broken line
alice:x:1000:1000:Alice,,,:/home/alice:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
";
    const GROUP: &str = "\
root:x:0:
adm:x:4:syslog,alice
alice:x:1000:
docker:x:999:bob,alice
";

    #[test]
    fn ids_have_names() {
        let owners = Owners::parse(PASSWD, GROUP);
        assert_eq!(owners.user(1000), Some("alice"));
        assert_eq!(owners.user(4242), None);
        assert_eq!(owners.group(999), Some("docker"));
        assert_eq!(owners.group(4), Some("adm"));
    }

    #[test]
    fn resolves_names_with_groups() {
        let a = resolve("alice", PASSWD, GROUP).expect("alice exists");
        assert_eq!((a.uid, a.gid, a.home.as_str()), (1000, 1000, "/home/alice"));
        assert_eq!(a.groups, vec![1000, 4, 999]);
        let root = resolve("root", PASSWD, GROUP).expect("root exists");
        assert_eq!((root.uid, root.gid, root.groups), (0, 0, vec![0]));
    }

    #[test]
    fn resolves_numeric_uids() {
        let a = resolve("1000", PASSWD, GROUP).expect("uid 1000 exists");
        assert_eq!(a.name, "alice");
        let unknown = resolve("4242", PASSWD, GROUP).expect("numeric uids always work");
        assert_eq!(
            (unknown.uid, unknown.gid, unknown.home.as_str()),
            (4242, 4242, "/")
        );
        assert_eq!(unknown.groups, vec![4242]);
    }

    #[test]
    fn root_works_without_files_and_unknown_names_fail() {
        let root = resolve("root", "", "").expect("root is built in");
        assert_eq!((root.uid, root.home.as_str()), (0, "/root"));
        assert_eq!(
            resolve("mallory", PASSWD, GROUP),
            Err(PasswdError::UnknownUser("mallory".into()))
        );
        assert_eq!(resolve("", PASSWD, GROUP), Err(PasswdError::Empty));
    }
}
