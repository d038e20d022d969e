"""Preflight on the login node (`train doctor --preflight`): will a job of this profile start?
Each check says how to fix what fails; one that cannot know says so (SKIP) and never fails
on not knowing; a warning (WARN) is a pass with a fix."""
