//! Counter keys and their document ids.
//!
//! A key is `(entity, action, uuid)`. Its document id is `<entity>_<action>_<uuid>`,
//! the layout CoreMedia and Kibana users already know. Because a part may itself
//! contain `_`, the parts are percent-escaped (`%` as `%25`, `_` as `%5F`) so two
//! different keys can never share an id, while a key whose parts hold neither
//! character encodes to exactly the plain string.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::Arc;

/// Longest name part in bytes, as for RavenDB counter names.
pub const MAX_NAME_BYTES: usize = 512;
/// Elasticsearch refuses `_id`s over 512 bytes; we refuse them before it does.
pub const MAX_DOC_ID_BYTES: usize = 512;

/// One counter: an action counted on a target (entity + uuid).
///
/// Parts are `Arc<str>` because a key is cloned into the coalescing map, the
/// store batch and every reply; cloning must not copy the bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterKey {
    pub entity: Arc<str>,
    pub action: Arc<str>,
    pub uuid: Arc<str>,
}

impl CounterKey {
    /// Builds a key after validating each part and the length of its id.
    /// The error names the offending field.
    pub fn new(entity: &str, action: &str, uuid: &str) -> Result<Self, String> {
        Self::new_in(entity, action, uuid, &mut Interner::default())
    }

    /// [`CounterKey::new`] with the parts shared through `names`, the
    /// interner of the batch the key is part of.
    pub fn new_in<'a>(
        entity: &'a str,
        action: &'a str,
        uuid: &'a str,
        names: &mut Interner<'a>,
    ) -> Result<Self, String> {
        let (entity, e_len) = names.name(Part::Entity, entity)?;
        let (action, a_len) = names.name(Part::Action, action)?;
        let (uuid, u_len) = names.name(Part::Uuid, uuid)?;
        // Measured without building the id: this runs for every event.
        let id_len = e_len + a_len + u_len + 2;
        if id_len > MAX_DOC_ID_BYTES {
            return Err(format!(
                "the document id of this counter would be {id_len} bytes, over the limit of {MAX_DOC_ID_BYTES}; use shorter names"
            ));
        }
        Ok(CounterKey {
            entity,
            action,
            uuid,
        })
    }

    /// The injective document id `<entity>_<action>_<uuid>`.
    pub fn doc_id(&self) -> String {
        let mut id =
            String::with_capacity(self.entity.len() + self.action.len() + self.uuid.len() + 2);
        escape_into(&mut id, &self.entity);
        id.push('_');
        escape_into(&mut id, &self.action);
        id.push('_');
        escape_into(&mut id, &self.uuid);
        id
    }
}

impl fmt::Display for CounterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.entity, self.action, self.uuid)
    }
}

/// Which name of an event a string is, for [`Interner::name`].
#[derive(Clone, Copy, Debug)]
pub enum Part {
    Entity,
    Action,
    Uuid,
    Category,
}

impl Part {
    fn field(self) -> &'static str {
        match self {
            Part::Entity => "entity",
            Part::Action => "action",
            Part::Uuid => "uuid",
            Part::Category => "category",
        }
    }
}

/// A validated name, and its length once escaped into a document id.
#[derive(Clone, Debug)]
struct Name {
    text: Arc<str>,
    escaped_len: usize,
}

/// The names of one batch, each validated and allocated once: a thousand
/// events on few counters share their `Arc<str>`s (and compare by pointer
/// when coalesced) instead of allocating three strings each. Holds the
/// batch's strings by reference, so it lives no longer than the body.
#[derive(Debug, Default)]
pub struct Interner<'a> {
    /// Every name seen, whatever its part: the rules are the same for all,
    /// so a string valid as one part is valid as any. `None` (the default)
    /// for a single event, which has nothing to share.
    seen: Option<HashMap<&'a str, Name>>,
    /// The last name of each part: events of a batch mostly repeat their
    /// neighbour's entity, action and category, and a compare costs less
    /// than a hash.
    last: [Option<(&'a str, Name)>; 4],
}

impl<'a> Interner<'a> {
    /// For a batch of about `events` events.
    pub fn for_batch(events: usize) -> Self {
        Interner {
            seen: Some(HashMap::with_capacity(events.min(16))),
            last: Default::default(),
        }
    }

    /// `value` validated as `part` ([`validate_name`]), shared, with its
    /// escaped length; the error names the part.
    pub fn name(&mut self, part: Part, value: &'a str) -> Result<(Arc<str>, usize), String> {
        let last = &mut self.last[part as usize];
        if let Some((text, name)) = last {
            if *text == value {
                return Ok((name.text.clone(), name.escaped_len));
            }
        }
        // Uuids are mostly distinct within a batch (10,000 keys or more
        // behind it): looking them up would cost more than it saves.
        let seen = match part {
            Part::Uuid => None,
            _ => self.seen.as_mut(),
        };
        let name = match seen.and_then(|seen| seen.get(value)) {
            Some(name) => name.clone(),
            None => {
                validate_name(part.field(), value)?;
                let name = Name {
                    text: value.into(),
                    escaped_len: escaped_len(value),
                };
                if let (Some(seen), false) = (&mut self.seen, matches!(part, Part::Uuid)) {
                    seen.insert(value, name.clone());
                }
                name
            }
        };
        let out = (name.text.clone(), name.escaped_len);
        *last = Some((value, name));
        Ok(out)
    }
}

/// Length of `part` once escaped: `_` and `%` take three bytes each.
fn escaped_len(part: &str) -> usize {
    part.len() + 2 * part.bytes().filter(|&b| b == b'_' || b == b'%').count()
}

fn escape_into(out: &mut String, part: &str) {
    if !part.contains(['_', '%']) {
        out.push_str(part);
        return;
    }
    for c in part.chars() {
        match c {
            '%' => out.push_str("%25"),
            '_' => out.push_str("%5F"),
            c => out.push(c),
        }
    }
}

/// Inverse of [`CounterKey::doc_id`]; `None` for a string no key encodes to.
pub fn decode_doc_id(id: &str) -> Option<(String, String, String)> {
    let mut parts = id.split('_');
    let (e, a, u) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    Some((unescape(e)?, unescape(a)?, unescape(u)?))
}

fn unescape(part: &str) -> Option<String> {
    let mut out = String::with_capacity(part.len());
    let mut rest = part;
    while let Some(pos) = rest.find('%') {
        out.push_str(&rest[..pos]);
        match rest.get(pos..pos + 3)? {
            "%25" => out.push('%'),
            "%5F" => out.push('_'),
            _ => return None,
        }
        rest = &rest[pos + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// A name part (entity, action, uuid, category): non-empty, at most
/// [`MAX_NAME_BYTES`] bytes, no control characters, not only white space.
pub fn validate_name(field: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!("{field} must not be empty"));
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(format!(
            "{field} is {} bytes, over the limit of {MAX_NAME_BYTES}",
            value.len()
        ));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        let mut shown = String::new();
        let _ = write!(shown, "U+{:04X}", c as u32);
        return Err(format!("{field} contains the control character {shown}"));
    }
    if value.chars().all(char::is_whitespace) {
        return Err(format!("{field} must contain a visible character"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(e: &str, a: &str, u: &str) -> CounterKey {
        CounterKey::new(e, a, u).unwrap()
    }

    #[test]
    fn plain_keys_encode_to_the_plain_id() {
        let k = key("VIDEO", "VIEW", "88d19b07-86d2-471d-be33-ed10eef5d38e");
        assert_eq!(
            k.doc_id(),
            "VIDEO_VIEW_88d19b07-86d2-471d-be33-ed10eef5d38e"
        );
        assert_eq!(
            key("comments", "comments:approvedComments", "x").doc_id(),
            "comments_comments:approvedComments_x"
        );
    }

    #[test]
    fn underscores_and_escape_char_are_escaped() {
        let k = key("USER", "user:number_of_logins", "a%b");
        assert_eq!(k.doc_id(), "USER_user:number%5Fof%5Flogins_a%25b");
        assert_eq!(
            decode_doc_id(&k.doc_id()),
            Some(("USER".into(), "user:number_of_logins".into(), "a%b".into()))
        );
        // The classic collision of naive joining: a_b + c vs a + b_c.
        assert_ne!(key("a_b", "c", "d").doc_id(), key("a", "b_c", "d").doc_id());
    }

    #[test]
    fn names_are_validated() {
        assert!(validate_name("entity", "").unwrap_err().contains("empty"));
        assert!(validate_name("entity", "a\u{7}b")
            .unwrap_err()
            .contains("U+0007"));
        assert!(validate_name("entity", "   ")
            .unwrap_err()
            .contains("visible"));
        assert!(validate_name("entity", &"x".repeat(513))
            .unwrap_err()
            .contains("513 bytes"));
        assert!(validate_name("entity", &"x".repeat(512)).is_ok());
        assert!(validate_name("entity", "vidéo 🎬").is_ok());
    }

    #[test]
    fn a_batch_shares_its_names_and_refuses_each_bad_one() {
        let mut names = Interner::for_batch(4);
        let a = CounterKey::new_in("VIDEO", "VIEW", "u1", &mut names).unwrap();
        let b = CounterKey::new_in("VIDEO", "like", "u2", &mut names).unwrap();
        let c = CounterKey::new_in("VIDEO", "VIEW", "u3", &mut names).unwrap();
        assert!(Arc::ptr_eq(&a.entity, &b.entity) && Arc::ptr_eq(&a.entity, &c.entity));
        assert!(
            Arc::ptr_eq(&a.action, &c.action),
            "not only the last one is shared"
        );
        assert_eq!(
            (&*b.action, &*b.uuid, &*c.action, &*c.uuid),
            ("like", "u2", "VIEW", "u3")
        );
        // A name seen as one part is the same name as another part.
        let d = CounterKey::new_in("VIEW", "VIDEO", "VIEW", &mut names).unwrap();
        assert_eq!(
            (&*d.entity, &*d.action, &*d.uuid),
            ("VIEW", "VIDEO", "VIEW")
        );
        // Bad names are never remembered: each event is refused, naming its part.
        for _ in 0..2 {
            let err = CounterKey::new_in("VIDEO", " ", "u", &mut names).unwrap_err();
            assert!(err.starts_with("action"), "{err}");
        }
        let err = CounterKey::new_in("VIDEO", "VIEW", " ", &mut names).unwrap_err();
        assert!(err.starts_with("uuid"), "{err}");
        // The id length counts escapes of shared names too.
        let long = "_".repeat(170);
        assert!(CounterKey::new_in(&long, "a", "b", &mut names).is_err());
        assert!(CounterKey::new_in(&long, "a", "b", &mut names).is_err());
    }

    #[test]
    fn ids_over_512_bytes_are_refused_not_cut() {
        let long = "x".repeat(300);
        let err = CounterKey::new(&long, &long, "u").unwrap_err();
        assert!(err.contains("over the limit of 512"), "{err}");
        // Escaping counts: 170 underscores become 510 bytes.
        let underscores = "_".repeat(170);
        assert!(CounterKey::new(&underscores, "a", "b").is_err());
    }

    fn part() -> impl Strategy<Value = String> {
        // Small alphabet heavy in the characters that matter to the encoding.
        proptest::collection::vec(
            prop_oneof![
                Just('_'),
                Just('%'),
                Just('5'),
                Just('F'),
                Just('2'),
                Just('a')
            ],
            1..8,
        )
        .prop_map(|cs| cs.into_iter().collect())
    }

    proptest! {
        #[test]
        fn different_keys_never_share_an_id(a in (part(), part(), part()), b in (part(), part(), part())) {
            let ka = key(&a.0, &a.1, &a.2);
            let kb = key(&b.0, &b.1, &b.2);
            prop_assert_eq!(ka == kb, ka.doc_id() == kb.doc_id());
        }

        #[test]
        fn id_length_is_measured_without_building_it(k in (part(), part(), part())) {
            let id = key(&k.0, &k.1, &k.2).doc_id();
            prop_assert_eq!(escaped_len(&k.0) + escaped_len(&k.1) + escaped_len(&k.2) + 2, id.len());
        }

        #[test]
        fn ids_decode_to_their_key(k in (part(), part(), part())) {
            let id = key(&k.0, &k.1, &k.2).doc_id();
            prop_assert_eq!(decode_doc_id(&id), Some(k));
        }
    }
}
