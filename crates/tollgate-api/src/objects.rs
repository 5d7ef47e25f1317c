//! Request bodies are JSON objects, at every level.
//!
//! serde's derived `Deserialize` for a struct also accepts a JSON array of its
//! fields in order, so `["c1", 5]` would be a credit and `["arr"]` an account.
//! Nobody writes a request that way on purpose, and a positional body silently
//! changes meaning when a field is added, so request types refuse it: each
//! derives its deserializer with `#[serde(remote = "Self")]`, which leaves the
//! derived code as an inherent function, and [`object_only!`] implements the
//! traits over it, asking the format for a map and never a sequence.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{MapAccess, Visitor};

/// A request type whose derived deserializer reads it from a map.
pub(crate) trait FromMap<'de>: Sized {
    fn from_map<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error>;
}

/// Accepts a JSON object and refuses every other JSON value, arrays included.
pub(crate) struct ObjectVisitor<T>(pub(crate) PhantomData<T>);

impl<'de, T: FromMap<'de>> Visitor<'de> for ObjectVisitor<T> {
    type Value = T;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::from_map(map)
    }
}

/// Implements `Serialize` and `Deserialize` for request types declared with
/// `#[serde(remote = "Self")]`: serialization is the derived one, and
/// deserialization is the derived one reached through a map only.
macro_rules! object_only {
    ($($name:ident),* $(,)?) => {$(
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                $name::serialize(self, serializer)
            }
        }

        impl<'de> $crate::objects::FromMap<'de> for $name {
            fn from_map<A: serde::de::MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
                $name::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                deserializer.deserialize_map($crate::objects::ObjectVisitor::<$name>(std::marker::PhantomData))
            }
        }
    )*};
}

pub(crate) use object_only;
