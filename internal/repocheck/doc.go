// Package repocheck holds no code: its tests check properties of the
// repository itself that no other package owns — that it explains itself
// (no comment cites a document the repository does not contain), that it
// carries its licence, and that its go directive does not force a newer
// toolchain than its dependencies need (ARCHITECTURE.md, "Package layout and
// import direction").
package repocheck
