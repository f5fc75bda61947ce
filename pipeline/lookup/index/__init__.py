"""The sense index: mixed token vectors of a dataset in LanceDB, searched by word."""
