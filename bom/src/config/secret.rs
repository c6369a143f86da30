//! Reading a [`SecretRef`] without ever echoing a secret.
//!
//! serde's own "invalid type" error quotes the offending value. For a
//! password written inline that would put the password into the terminal
//! and into logs, so a scalar here gets a message that names no value.

use std::fmt;
use std::path::PathBuf;

use serde::de::{self, Deserializer, MapAccess, Visitor};

use super::model::SecretRef;

impl<'de> serde::Deserialize<'de> for SecretRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SecretVisitor)
    }
}

const INLINE: &str = "an inline secret is not accepted (it would end up in logs and in version control); write `fromEnv: VARIABLE` or `fromFile: PATH` instead";

struct SecretVisitor;

impl<'de> Visitor<'de> for SecretVisitor {
    type Value = SecretRef;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("`fromEnv: VARIABLE` or `fromFile: PATH`")
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<SecretRef, E> {
        Err(E::custom(INLINE))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<SecretRef, E> {
        Err(E::custom(INLINE))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<SecretRef, E> {
        Err(E::custom(INLINE))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<SecretRef, E> {
        Err(E::custom(INLINE))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<SecretRef, E> {
        Err(E::custom(INLINE))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SecretRef, A::Error> {
        let mut out = SecretRef::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "fromEnv" => out.from_env = Some(map.next_value()?),
                "fromFile" => out.from_file = Some(map.next_value::<PathBuf>()?),
                _ => return Err(de::Error::unknown_field(&key, &["fromEnv", "fromFile"])),
            }
        }
        Ok(out)
    }
}
