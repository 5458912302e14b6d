// The CDK's own template diff engine (@aws-cdk/cloudformation-diff, the one `cdk diff` bundles),
// for `python -m model_build plan` (model_build/tools/review/plan_verdict.py, `engine_diff`).
//
// Reads {"old": <template>, "new": <template>} as JSON on stdin and writes, as JSON on stdout, each
// resource that differs: its types, its change impact (WILL_UPDATE, WILL_CREATE, WILL_REPLACE,
// MAY_REPLACE, WILL_DESTROY, WILL_ORPHAN...) with replacements propagated through Ref and
// Fn::GetAtt, and the impact of each changed property. No AWS call; the engine reads the
// CloudFormation resource specification it ships to know which property changes replace.
'use strict';

const { fullDiff } = require('@aws-cdk/cloudformation-diff');

function main() {
  // Load the resource specification now, while the caller is still reading its inputs: the first
  // diff that looks a resource type up loads it (about half a second), and the caller starts this
  // process before it needs the answer.
  fullDiff({ Resources: { W: { Type: 'AWS::S3::Bucket', Properties: { BucketName: 'a' } } } },
    { Resources: { W: { Type: 'AWS::S3::Bucket', Properties: { BucketName: 'b' } } } });
  const chunks = [];
  process.stdin.on('data', (chunk) => chunks.push(chunk));
  process.stdin.on('end', () => {
    const input = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    const diff = fullDiff(input.old || {}, input.new || {});
    const resources = {};
    diff.resources.forEachDifference((logicalId, change) => {
      if (!change.isDifferent) {
        return;
      }
      const properties = {};
      for (const [name, property] of Object.entries(change.propertyUpdates)) {
        properties[name] = property.changeImpact || 'WILL_UPDATE';
      }
      resources[logicalId] = {
        old_type: change.oldResourceType || null,
        new_type: change.newResourceType || null,
        impact: change.changeImpact,
        addition: change.isAddition,
        removal: change.isRemoval,
        properties,
        other: Object.keys(change.otherChanges).sort(),
      };
    });
    process.stdout.write(JSON.stringify({ resources }));
  });
}

main();
