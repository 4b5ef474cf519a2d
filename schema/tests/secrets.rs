//! Secrets corpus (written next).
