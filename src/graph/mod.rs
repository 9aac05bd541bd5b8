//! The stream-dependency graph: ops as nodes, happens-before edges between them; explanations of
//! hazards, and pictures of them.

pub mod picture;
pub mod render;

pub use picture::{Edge, EdgeKind, Lane, Node, Picture, PictureHazard, Role};
pub use render::{render_dot, render_html};
