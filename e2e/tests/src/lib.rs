//! Helpers shared by the world tests: endpoints of the running world and small waits.
