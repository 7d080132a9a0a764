package cli

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"
)

// Output formats of -o: every listing prints as a table (its own layout),
// JSON or YAML (the JSON's fields, in the same order).
var outputFormats = []string{"table", "json", "yaml"}

// addOutputFlag adds -o/--output to cmd, with shell completion of its
// values.
func addOutputFlag(cmd *cobra.Command, format *string) {
	cmd.Flags().StringVarP(format, "output", "o", "table", "output format: table, json or yaml")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(outputFormats, cobra.ShellCompDirectiveNoFileComp))
}

// checkOutput refuses a format -o does not know.
func checkOutput(format string) error {
	for _, f := range outputFormats {
		if format == f {
			return nil
		}
	}
	return usageError("-o %q: want table, json or yaml", format)
}

// printOut writes v to w in format: table prints it with table.
func printOut[T any](w io.Writer, format string, v T, table func(io.Writer, T) error) error {
	switch format {
	case "json":
		return writeJSONOut(w, v)
	case "yaml":
		return writeYAMLOut(w, v)
	case "table", "":
		return table(w, v)
	}
	return checkOutput(format)
}

func writeJSONOut(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeYAMLOut writes v as YAML with the field names and order of its
// JSON: the JSON is read as YAML (a subset of it) and written back in
// block style, numbers staying numbers.
func writeYAMLOut(w io.Writer, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	blockStyle(&doc)
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	return enc.Close()
}

// blockStyle drops the JSON's flow style and quotes; the encoder quotes
// again the strings that need it.
func blockStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		blockStyle(c)
	}
}
