// Split text the way an LLM streams it: words with their leading space, long words in pieces.
// Mirrors myna.rtc.client.token_chunks, so the page and the Python client feed the worker alike.
//
//   tokenChunks("Hello wonderful world") → ["Hello", " wond", "erfu", "l", " world"]

export function tokenChunks(text, piece = 4) {
  const chunks = [];
  for (const word of text.match(/\s*\S+/g) || []) {
    const rest = word.trimStart();
    const head = word.slice(0, word.length - rest.length);
    if (rest.length <= piece + 2) {
      chunks.push(word);
      continue;
    }
    for (let i = 0; i < rest.length; i += piece) {
      chunks.push((i === 0 ? head : "") + rest.slice(i, i + piece));
    }
  }
  return chunks;
}
