// Fixture trees hold file names with ':' that module zips reject; this module keeps them out of the
// fabricxfer module. The generator in gen/ writes the trees.
module github.com/fabricxfer/fabricxfer/topology/testdata

go 1.26.0
