//! What is computed over a checked trace: the synchronization analysis ([`syncs`]), which says
//! of every synchronization op whether the program's memory safety needs it, and what it
//! prevents.

pub mod syncs;
