"""Training the demo model; README.md in this directory is its model card."""
